"""A result left as fp32 parts that its consumer adds up: the reduction of a split costs no launch.

A GEMM of a few rows against a weight of few rows keeps too few programs reading to reach the
memory's bandwidth; split along K (or, for the MoE, over groups of a token's choices) it has enough,
but the parts must then be summed. The ops that read such results (the residual add-norm after
every mixer and feed-forward block, the MoE router) take the parts and sum them as they load them,
in fp32, then round the sum to `dtype` as an unsplit result would have been. The kernels add the
parts in a fixed tree (triton_partial_sums.py), so a run reproduces itself bit for bit.
"""

from typing import NamedTuple

import torch


class PartialSums(NamedTuple):
    parts: torch.Tensor  # [S, M, N] fp32
    dtype: torch.dtype  # what the sum stands for (the dtype an unsplit op would have returned)

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    @property
    def is_cuda(self) -> bool:  # for the dispatch, which asks it of a tensor
        return self.parts.is_cuda

    def total(self) -> torch.Tensor:
        """The sum in fp32 (part 0 first), rounded to dtype once: the torch references' reading."""
        acc = self.parts[0]
        for part in self.parts[1:]:
            acc = acc + part
        return acc.to(self.dtype)


def total(x: "torch.Tensor | PartialSums") -> torch.Tensor:
    """x itself, or the sum of its parts: for the torch references, which take both."""
    return x.total() if isinstance(x, PartialSums) else x


def as_parts(x: "torch.Tensor | PartialSums") -> tuple[torch.Tensor, torch.dtype]:
    """(parts [S, ...], dtype of the sum) for the kernels that take both: a tensor is its one part."""
    return (x.parts, x.dtype) if isinstance(x, PartialSums) else (x[None], x.dtype)


def first_columns(x: "torch.Tensor | PartialSums", stop: int) -> "torch.Tensor | PartialSums":
    """x[:, :stop] of a tensor or of each part (views)."""
    if isinstance(x, PartialSums):
        return PartialSums(x.parts[..., :stop], x.dtype)
    return x[..., :stop]
