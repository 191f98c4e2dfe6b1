"""RMSNorm as a module: its weight, epsilon, and whether it scales by w or by (1 + w)."""

import torch
from torch import nn

from deltaserve import kernels
from deltaserve.models.layers.params import empty_param


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float, dtype: torch.dtype, device):
        super().__init__()
        self.weight = empty_param(dim, dtype=dtype, device=device)
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: norm(x). With residual: (norm(x + residual), x + residual)."""
        if residual is None:
            return kernels.rms_norm(x, self.weight, self.eps, self.offset)
        return kernels.add_rms_norm(x, residual, self.weight, self.eps, self.offset)
