"""SiLU(gate) * up over a tensor whose last dim holds [gate | up]."""

import torch


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
