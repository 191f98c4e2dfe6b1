"""A projection whose only consumer is the residual add-norm, left for that add to run as one GEMM.

In a long pass each block's output projection writes its [T, H] result, and the add-norm after it reads
that and the residual stream and writes their sum and its norm: five passes over [T, H]. Left pending, the
add-norm runs `residual += x @ W^T` on cuBLAS, which adds the product to the residual in the GEMM's
epilogue (beta = 1: it reads the residual and writes the sum over it), and then norms the sum: four passes,
the product never written out. On the H100 the sums came out byte-identical to the unfused add's, which
rounds the product to the stream's dtype first (8192 and 32768 rows of the 9B shape's projections,
benchmarks/results/prefill_fusions_h100_at_daa9d70.json): cuBLAS evidently rounds it before adding as well,
so a pass leaves the same bytes whether or not its projections were left pending.

The residual is overwritten: the decoder's stream is a tensor the layers own (the embedding's output, then
each add-norm's sum), which nothing reads after the next add.
"""

from typing import NamedTuple

import torch


class PendingProjection(NamedTuple):
    x: torch.Tensor  # [M, K]
    weight: torch.Tensor  # [N, K]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.x.shape[0], self.weight.shape[0]))

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def is_cuda(self) -> bool:  # for the dispatch, which asks it of a tensor
        return self.x.is_cuda

    def total(self) -> torch.Tensor:
        """The product itself (the torch references' reading)."""
        return self.x @ self.weight.T

    def added_to(self, residual: torch.Tensor) -> torch.Tensor:
        """residual + x @ W^T, written into residual where cuBLAS can take it in place."""
        if residual.is_contiguous() and residual.dtype == self.x.dtype and residual.shape == self.shape:
            return residual.addmm_(self.x, self.weight.T)
        return residual + self.total()
