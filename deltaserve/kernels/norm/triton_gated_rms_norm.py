"""Gated RMSNorm (the GDN output norm): `w * x_hat * silu(gate)` per row, one program per row."""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.norm.triton_rms_norm import as_rows_3d
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid


@triton.jit
def _gated_rms_norm_kernel(
    x, gate, weight, out, inner, stride_x0, stride_x1, stride_g0, stride_g1, eps,
    N: tl.constexpr, BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    row = tl.program_id(0)
    outer, within = (row // inner).to(tl.int64), (row % inner).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    xf = tl.load(x + outer * stride_x0 + within * stride_x1 + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate + outer * stride_g0 + within * stride_g1 + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / N + eps)
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    y = xf * rstd * w * (g / (1.0 + tl.exp(-g)))
    tl.store(out + row.to(tl.int64) * N + cols, y.to(out.dtype.element_ty), mask=mask)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x3, g3 = as_rows_3d(x), as_rows_3d(gate.expand_as(x))
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x3.shape[0] * x3.shape[1]
    if rows:
        block = triton.next_power_of_2(n)
        _gated_rms_norm_kernel[(rows,)](
            x3, g3, weight, out, x3.shape[1], x3.stride(0), x3.stride(1), g3.stride(0), g3.stride(1), eps,
            N=n, BLOCK=block, num_warps=min(max(block // 256, 1), 8), **launch_options(x),
        )
    return out
