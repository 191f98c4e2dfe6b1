"""SiLU(gate) * up over rows whose last dim holds [gate | up]; one program per (row, column tile).

Launched as a dependent grid (kernels/pdl.py): in a decode step it sits between the gate/up and the down
projection, and its launch is set up while the gate/up projection still runs. The down projection's launch
waits for its end (wait_for_prior_grid_only)."""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid_only


@triton.jit
def _silu_and_mul_kernel(x, out, stride_x, WIDTH: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_prior_grid_only(USE_PDL)
    row, tile = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    gate = tl.load(x + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + row * stride_x + WIDTH + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out + row * WIDTH + cols, y.to(out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    width = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows:
        block = min(triton.next_power_of_2(width), 1024)
        _silu_and_mul_kernel[(rows, triton.cdiv(width, block))](
            x2, out, x2.stride(0), WIDTH=width, BLOCK=block, num_warps=4 if block >= 512 else 1,
            **launch_options(x2),
        )
    return out
