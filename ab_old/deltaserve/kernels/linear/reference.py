"""y = x @ W^T (+ b): the models' projections (cuBLAS through torch on the GPU)."""

import torch
from torch.nn import functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K]; weight [N, K]; bias [N] or None; returns [M, N] in x's dtype."""
    return F.linear(x, weight, bias)
