"""The experts' SwiGLU MLPs for a few tokens: no sorting, each (token, choice) pair reads its expert's
weights straight by expert id.

At decode sizes sorting the pairs by expert costs more than it saves (a sort, an align kernel, a
combine), and a pair rarely shares its expert with another. So:
  1. gate/up: one program per (pair, tile of BLOCK_N intermediate columns) is a GEMV of the token's
     row against the expert's gate and up rows; it writes weight * silu(gate) * up (fp32) for its pair.
  2. down: one program per (token, tile of BLOCK_N output columns) runs the down GEMV of each of the
     token's k choices in turn, summed in registers in a fixed order (no atomics: a run reproduces
     itself bit for bit), and writes the token's output row once. When the caller takes PartialSums
     (`partial`), the choices are split into groups, one program per (token, tile, group), each
     writing its group's fp32 sum: three times the programs reading at once, and the consumer (the
     residual add-norm) adds the groups up.
The pair (token) index is the fast grid axis, so pairs that share an expert read the same weight tile
at about the same time and the second read comes from L2. Grids and buffers depend only on the shapes,
so a decode step with this path can be captured in a CUDA graph.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from deltaserve.kernels.partial_sums import PartialSums
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid


@triton.jit
def _direct_gate_up_kernel(
    x, w13, weights, ids, inter, stride_x, stride_we, stride_wn,
    TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr, EXPERTS: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    pair, ntile = tl.program_id(0), tl.program_id(1)
    token = (pair // TOP_K).to(tl.int64)
    expert = tl.load(ids + pair).to(tl.int64)
    offs_n = ntile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = (offs_n < INTER) & (expert < EXPERTS)  # an unrouted pair reads no weights (the down kernel skips it)
    gate_rows = w13 + expert * stride_we + offs_n[:, None] * stride_wn
    up_rows = gate_rows + INTER * stride_wn
    # Products are summed along K in registers and reduced once at the end.
    acc_gate = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.range(0, HIDDEN, BLOCK_K, num_stages=STAGES):  # stages > 1: loads run ahead (cp.async)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < HIDDEN
        xk = tl.load(x + token * stride_x + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        w_mask = mask_n[:, None] & mask_k[None, :]
        w_gate = tl.load(gate_rows + offs_k[None, :], mask=w_mask, other=0.0).to(tl.float32)
        w_up = tl.load(up_rows + offs_k[None, :], mask=w_mask, other=0.0).to(tl.float32)
        acc_gate += w_gate * xk[None, :]
        acc_up += w_up * xk[None, :]
    gate = tl.sum(acc_gate, 1)
    up = tl.sum(acc_up, 1)
    routing_weight = tl.load(weights + pair).to(tl.float32)
    h = gate / (1.0 + tl.exp(-gate)) * up * routing_weight
    tl.store(inter + pair.to(tl.int64) * INTER + offs_n, h, mask=mask_n)


@triton.jit
def _direct_down_kernel(
    inter, w2, ids, out, stride_we, stride_wn, stride_out, stride_group,
    TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UNROLL: tl.constexpr, STAGES: tl.constexpr, EXPERTS: tl.constexpr, GROUP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """Program (token, tile, group): choices [group * GROUP, +GROUP) into out[group]."""
    wait_for_prior_grid(USE_PDL)
    token, ntile, group = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    offs_n = ntile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < HIDDEN
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    first_choice = group * GROUP
    end = tl.minimum(first_choice + GROUP, TOP_K)
    # UNROLL choices per step: their weight loads are in flight together. The sum runs over the
    # choices in order whatever UNROLL is, so the result does not depend on it.
    for first in tl.range(first_choice, first_choice + GROUP, UNROLL, num_stages=STAGES):
        for j in tl.static_range(UNROLL):
            choice = first + j
            live = choice < end
            pair = token * TOP_K + choice
            expert = tl.load(ids + pair, mask=live, other=0).to(tl.int64)
            live = live & (expert < EXPERTS)  # an unrouted pair adds nothing
            rows = w2 + expert * stride_we + offs_n[:, None] * stride_wn
            for k0 in tl.static_range(0, INTER, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                mask_k = (offs_k < INTER) & live
                h = tl.load(inter + pair * INTER + offs_k, mask=mask_k, other=0.0)
                w = tl.load(rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
                acc += w.to(tl.float32) * h[None, :]
    y = tl.sum(acc, 1)
    tl.store(out + group * stride_group + token * stride_out + offs_n, y.to(out.dtype.element_ty), mask=mask_n)


class DirectTiles(NamedTuple):
    gate_n: int = 16  # gate/up kernel: intermediate columns per program
    gate_k: int = 256  # hidden columns per step
    gate_warps: int = 4
    gate_stages: int = 3  # steps whose loads are in flight at once
    down_n: int = 8  # down kernel: output columns per program
    down_k: int = 512  # intermediate columns per step
    down_warps: int = 4
    down_unroll: int = 2  # choices per step
    down_stages: int = 2
    down_groups: int = 3  # with `partial`: groups of choices, each its own program and fp32 part


DEFAULT_TILES = DirectTiles()
# With `partial`: the down kernel's groups of three choices, each program's three weight loads in
# flight at once. Up to PARTIAL_MAX_TOKENS tokens only: on the H200 (kernels_check moe_direct_partial,
# top-8) one token took 14.3 us against 15.6 whole, eight tokens 90.2 against 90.4, 16 tokens 160.8
# against 159.1 and 24 tokens 224.7 against 218.9; with these tiles, above that, it stays whole.
PARTIAL_TILES = DirectTiles(down_unroll=3, down_stages=1, down_groups=3)
PARTIAL_MAX_TOKENS = 8


def moe_experts_direct(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                       ids: torch.Tensor, tiles: tuple[int, ...] | None = None,
                       partial: bool = False) -> torch.Tensor | PartialSums:
    """Same contract as the reference: x [T, H]; w13 [E, 2I, H]; w2 [E, H, I]; weights/ids [T, k].
    partial: the caller takes PartialSums; up to PARTIAL_MAX_TOKENS tokens (or with tiles given) it gets
    them, one fp32 part per group of choices (DirectTiles.down_groups)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    assert w13.stride(-1) == 1 and w2.stride(-1) == 1
    tokens, hidden = x.shape
    inter_size = w13.shape[1] // 2
    top_k = ids.shape[1]
    partial = partial and (tiles is not None or tokens <= PARTIAL_MAX_TOKENS)
    tiles = DirectTiles(*tiles) if tiles else PARTIAL_TILES if partial else DEFAULT_TILES
    gu_n, gu_k, gu_warps, gu_stages, dn_n, dn_k, dn_warps, unroll, dn_stages, groups = tiles
    group = triton.cdiv(top_k, min(groups, top_k)) if partial else top_k  # choices per group
    groups = triton.cdiv(top_k, group)
    if partial:
        out = torch.empty((groups, tokens, hidden), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty_like(x)
    if tokens:
        ids = ids.reshape(-1).contiguous()
        weights = weights.reshape(-1).contiguous()
        gu_k = min(gu_k, triton.next_power_of_2(hidden))
        dn_k = min(dn_k, triton.next_power_of_2(inter_size))
        inter = torch.empty((tokens * top_k, inter_size), dtype=torch.float32, device=x.device)
        _direct_gate_up_kernel[(tokens * top_k, triton.cdiv(inter_size, gu_n))](
            x, w13, weights, ids, inter, x.stride(0), w13.stride(0), w13.stride(1),
            TOP_K=top_k, HIDDEN=hidden, INTER=inter_size, BLOCK_N=gu_n, BLOCK_K=gu_k, STAGES=gu_stages,
            EXPERTS=w13.shape[0], num_warps=gu_warps, **launch_options(x),
        )
        _direct_down_kernel[(tokens, triton.cdiv(hidden, dn_n), groups)](
            inter, w2, ids, out, w2.stride(0), w2.stride(1), out.stride(-2), out.stride(0) if partial else 0,
            TOP_K=top_k, HIDDEN=hidden, INTER=inter_size, BLOCK_N=dn_n, BLOCK_K=dn_k,
            UNROLL=min(unroll, group), STAGES=dn_stages, EXPERTS=w13.shape[0], GROUP=group, num_warps=dn_warps,
            **launch_options(x),
        )
    return PartialSums(out, x.dtype) if partial else out
