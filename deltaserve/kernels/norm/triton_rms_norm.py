"""RMSNorm, `w * x_hat` or `(1 + w) * x_hat`, over a tile of rows per program (one wide row, or
several narrow ones: rows_per_program.py); with a residual, the sum `x + residual` is written out and
normalised in the same pass (the pre-norm block's two streams). x may come as PartialSums (a split
projection's fp32 parts): they are added up on load (triton_partial_sums.py) and rounded to the
stream's dtype before the residual is added, as an unsplit x would have been."""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.norm.rows_per_program import rows_per_program, warps_for
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
def row_tile(program, rows, inner, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr, N: tl.constexpr):
    """This program's rows of an [A, inner, N] view: (outer, within) indices and row numbers (int64), the
    columns and the tile's mask, shaped so that they broadcast to the tile: scalars and [BLOCK] for one
    row (1-D as the one-row kernels always were: a decode step's norms take no layout conversion),
    [BLOCK_R, 1] and [1, BLOCK] for several."""
    cols = tl.arange(0, BLOCK)
    if BLOCK_R == 1:  # a constexpr test: only one branch is compiled, so the shapes may differ
        row = program
        mask = cols < N
    else:
        row = (program * BLOCK_R + tl.arange(0, BLOCK_R))[:, None]
        mask = (row < rows) & (cols < N)[None, :]
        cols = cols[None, :]
    return (row // inner).to(tl.int64), (row % inner).to(tl.int64), row.to(tl.int64), cols, mask


@triton.jit
def row_sums(x, BLOCK_R: tl.constexpr):
    """Each row's sum of a row_tile-shaped tile, broadcastable against it."""
    if BLOCK_R == 1:
        sums = tl.sum(x, 0)
    else:
        sums = tl.sum(x, 1, keep_dims=True)
    return sums


@triton.jit
def _rms_norm_kernel(
    x, residual, weight, out, summed, rows, inner, stride_x0, stride_x1, stride_r0, stride_r1, stride_part, eps,
    offset, N: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PARTS: tl.constexpr, BLOCK_P: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    tl.static_assert(PARTS == 1 or BLOCK_R == 1, "PartialSums come one row a program")
    wait_for_prior_grid(USE_PDL)
    outer, within, row, cols, mask = row_tile(tl.program_id(0), rows, inner, BLOCK_R, BLOCK, N)
    x_ptrs = x + outer * stride_x0 + within * stride_x1 + cols
    if PARTS > 1:
        xs = load_summed(x_ptrs, mask, stride_part, PARTS, BLOCK_P).to(summed.dtype.element_ty)
    else:
        xs = tl.load(x_ptrs, mask=mask, other=0.0)
    out_offs = row * N + cols
    if HAS_RESIDUAL:
        rs = tl.load(residual + outer * stride_r0 + within * stride_r1 + cols, mask=mask, other=0.0)
        xs = (xs.to(tl.float32) + rs.to(tl.float32)).to(summed.dtype.element_ty)  # rounded as the stream is
        tl.store(summed + out_offs, xs, mask=mask)
    xf = xs.to(tl.float32)
    rstd = 1.0 / tl.sqrt(row_sums(xf * xf, BLOCK_R) / N + eps)
    w = tl.load(weight + cols, mask=cols < N, other=0.0).to(tl.float32) + offset
    tl.store(out + out_offs, (xf * rstd * w).to(out.dtype.element_ty), mask=mask)


def _launch(x, residual, weight, eps, offset, block_rows=None):
    parts, dtype = as_parts(x)
    x3 = as_rows_3d(parts[0])
    r3 = as_rows_3d(residual) if residual is not None else x3
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=dtype, device=parts.device)
    summed = torch.empty(x.shape, dtype=dtype, device=parts.device) if residual is not None else out
    rows = x3.shape[0] * x3.shape[1]
    if rows:
        block = triton.next_power_of_2(n)
        block_rows = 1 if parts.shape[0] > 1 else block_rows or rows_per_program(rows, block)
        _rms_norm_kernel[(triton.cdiv(rows, block_rows),)](
            x3, r3, weight, out, summed, rows, x3.shape[1], x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
            parts.stride(0), eps, float(offset), N=n, BLOCK=block, BLOCK_R=block_rows,
            HAS_RESIDUAL=residual is not None, PARTS=parts.shape[0], BLOCK_P=triton.next_power_of_2(parts.shape[0]),
            num_warps=warps_for(block_rows, block), **launch_options(parts),
        )
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
             block_rows: int | None = None) -> torch.Tensor:
    """block_rows (a power of two) overrides rows_per_program: tests use it to cover the row tiles."""
    return _launch(x, None, weight, eps, offset, block_rows)[0]


def add_rms_norm(x: torch.Tensor | PartialSums, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 offset: float = 0.0, block_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(x, residual, weight, eps, offset, block_rows)
