"""The SwiGLU feed-forward block, gate and up projections fused into one GEMM."""

import torch
from torch import nn

from deltaserve import kernels
from deltaserve.models.layers.params import empty_param


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype, device, bias: bool = False):
        super().__init__()
        self.gate_up_proj = empty_param(2 * intermediate, hidden, dtype=dtype, device=device)
        self.down_proj = empty_param(hidden, intermediate, dtype=dtype, device=device)
        self.gate_up_bias = empty_param(2 * intermediate, dtype=dtype, device=device) if bias else None
        self.down_bias = empty_param(hidden, dtype=dtype, device=device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor | kernels.PartialSums:
        """The output feeds the next residual add-norm only, so it may be PartialSums."""
        hidden = kernels.silu_and_mul(kernels.linear(x, self.gate_up_proj, self.gate_up_bias))
        return kernels.linear_to_residual(hidden, self.down_proj, self.down_bias)
