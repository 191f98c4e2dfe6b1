"""RMSNorm variants, computed in fp32 and cast back to the input dtype.

`offset` is 0 for the usual `w * x_hat` and 1 for the zero-centred `(1 + w) * x_hat` of Qwen3-Next/3.5.
"""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (weight.float() + offset)).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual): the pre-norm block's two streams."""
    summed = x + residual
    return rms_norm(summed, weight, eps, offset), summed


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x (per row of the last dim), scaled by w, then multiplied by silu(gate)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight.float() * xf
    return (y * torch.nn.functional.silu(gate.float())).to(x.dtype)
