"""Gated RMSNorm (the GDN output norm): `w * x_hat * silu(gate)` per row, over a tile of rows per
program (rows_per_program.py: an 8k-token prompt has 262144 rows of 128)."""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.norm.rows_per_program import rows_per_program, warps_for
from deltaserve.kernels.norm.triton_rms_norm import as_rows_3d, row_sums, row_tile
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid_only


@triton.jit
def _gated_rms_norm_kernel(
    x, gate, weight, out, rows, inner, stride_x0, stride_x1, stride_g0, stride_g1, eps,
    N: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid_only(USE_PDL)
    outer, within, row, cols, mask = row_tile(tl.program_id(0), rows, inner, BLOCK_R, BLOCK, N)
    xf = tl.load(x + outer * stride_x0 + within * stride_x1 + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate + outer * stride_g0 + within * stride_g1 + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(row_sums(xf * xf, BLOCK_R) / N + eps)
    w = tl.load(weight + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = xf * rstd * w * (g / (1.0 + tl.exp(-g)))
    tl.store(out + row * N + cols, y.to(out.dtype.element_ty), mask=mask)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   block_rows: int | None = None) -> torch.Tensor:
    """block_rows (a power of two) overrides rows_per_program: tests use it to cover the row tiles."""
    x3, g3 = as_rows_3d(x), as_rows_3d(gate.expand_as(x))
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x3.shape[0] * x3.shape[1]
    if rows:
        block = triton.next_power_of_2(n)
        block_rows = block_rows or rows_per_program(rows, block)
        _gated_rms_norm_kernel[(triton.cdiv(rows, block_rows),)](
            x3, g3, weight, out, rows, x3.shape[1], x3.stride(0), x3.stride(1), g3.stride(0), g3.stride(1), eps,
            N=n, BLOCK=block, BLOCK_R=block_rows, num_warps=warps_for(block_rows, block), **launch_options(x),
        )
    return out
