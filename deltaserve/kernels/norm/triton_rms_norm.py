"""RMSNorm, `w * x_hat` or `(1 + w) * x_hat`, one program per row; with a residual, the sum
`x + residual` is written out and normalised in the same pass (the pre-norm block's two streams).
x may come as PartialSums (a split projection's fp32 parts): they are added up on load
(triton_partial_sums.py) and rounded to the stream's dtype before the residual is added, as an
unsplit x would have been."""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.partial_sums import PartialSums, as_parts
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid
from deltaserve.kernels.triton_partial_sums import load_summed


def as_rows_3d(x: torch.Tensor) -> torch.Tensor:
    """x [..., N] as a [A, B, N] view (copying only when no such view exists) whose last dim is dense.

    Per-head inputs sliced out of a fused projection ([T, H, D] with a row stride wider than H * D)
    stay views: a program finds its row from (row // B, row % B) and the two outer strides.
    """
    if x.dim() == 1:
        x = x[None, None]
    elif x.dim() == 2:
        x = x[None]
    elif x.dim() > 3:
        x = x.reshape(-1, x.shape[-2], x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


@triton.jit
def _rms_norm_kernel(
    x, residual, weight, out, summed, inner, stride_x0, stride_x1, stride_r0, stride_r1, stride_part, eps, offset,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PARTS: tl.constexpr, BLOCK_P: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    row = tl.program_id(0)
    outer, within = (row // inner).to(tl.int64), (row % inner).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if PARTS > 1:
        xs = load_summed(x + outer * stride_x0 + within * stride_x1 + cols, mask, stride_part, PARTS, BLOCK_P)
        xs = xs.to(summed.dtype.element_ty)
    else:
        xs = tl.load(x + outer * stride_x0 + within * stride_x1 + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        rs = tl.load(residual + outer * stride_r0 + within * stride_r1 + cols, mask=mask, other=0.0)
        xs = (xs.to(tl.float32) + rs.to(tl.float32)).to(summed.dtype.element_ty)  # rounded as the stream is
        tl.store(summed + row.to(tl.int64) * N + cols, xs, mask=mask)
    xf = xs.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / N + eps)
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32) + offset
    tl.store(out + row.to(tl.int64) * N + cols, (xf * rstd * w).to(out.dtype.element_ty), mask=mask)


def _launch(x, residual, weight, eps, offset):
    parts, dtype = as_parts(x)
    x3 = as_rows_3d(parts[0])
    r3 = as_rows_3d(residual) if residual is not None else x3
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=dtype, device=parts.device)
    summed = torch.empty(x.shape, dtype=dtype, device=parts.device) if residual is not None else out
    rows = x3.shape[0] * x3.shape[1]
    if rows:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows,)](
            x3, r3, weight, out, summed, x3.shape[1], x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
            parts.stride(0), eps, float(offset), N=n, BLOCK=block, HAS_RESIDUAL=residual is not None,
            PARTS=parts.shape[0], BLOCK_P=triton.next_power_of_2(parts.shape[0]),
            num_warps=min(max(block // 256, 1), 8), **launch_options(parts),
        )
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    return _launch(x, None, weight, eps, offset)[0]


def add_rms_norm(x: torch.Tensor | PartialSums, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(x, residual, weight, eps, offset)
