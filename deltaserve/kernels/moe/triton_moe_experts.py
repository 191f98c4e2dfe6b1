"""The experts' SwiGLU MLPs as two grouped GEMMs over (token, choice) pairs sorted by expert.

Pairs are sorted by expert on the device (no host sync, so a decode step can be graph-captured).
One program per (expert, tile of output columns) loops over its expert's pairs in tiles of rows, so
each touched expert's weight tile is read from memory once per step at decode sizes; experts with no
pairs return at once.
  1. gate/up: inter[pair] = silu(x[token] @ W_gate^T) * (x[token] @ W_up^T), both halves in one program.
  2. down:    y[token, choice] = weight * (inter[pair] @ W_down^T), written to the pair's own row.
The k rows of each token are then summed in fp32 in a fixed order: no atomics, so results are exact
across runs (a prefix-cache hit must reproduce a miss bit for bit).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _moe_gate_up_kernel(
    x, w13, token_of_pair, expert_offsets, inter, stride_x, stride_we, stride_wn, stride_inter,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    expert, ntile = tl.program_id(0), tl.program_id(1)
    lo = tl.load(expert_offsets + expert)
    hi = tl.load(expert_offsets + expert + 1)
    offs_n = ntile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < INTER
    w_base = w13 + expert.to(tl.int64) * stride_we
    m0 = lo
    while m0 < hi:  # a while loop: the interpreter cannot take loaded bounds in range()
        pairs = m0 + tl.arange(0, BLOCK_M)
        mask_m = pairs < hi
        tokens = tl.load(token_of_pair + pairs, mask=mask_m, other=0).to(tl.int64)
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < HIDDEN
            a = tl.load(x + tokens[:, None] * stride_x + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                        other=0.0)
            w_mask = mask_n[:, None] & mask_k[None, :]
            w_gate = tl.load(w_base + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
            w_up = tl.load(w_base + (INTER + offs_n)[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
            acc_gate = tl.dot(a, tl.trans(w_gate), acc_gate, input_precision=PRECISION)
            acc_up = tl.dot(a, tl.trans(w_up), acc_up, input_precision=PRECISION)
        h = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
        tl.store(inter + pairs.to(tl.int64)[:, None] * stride_inter + offs_n[None, :], h.to(inter.dtype.element_ty),
                 mask=mask_m[:, None] & mask_n[None, :])
        m0 += BLOCK_M


@triton.jit
def _moe_down_kernel(
    inter, w2, pair_weight, pair_dest, expert_offsets, y, stride_inter, stride_we, stride_wn, stride_y,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    expert, ntile = tl.program_id(0), tl.program_id(1)
    lo = tl.load(expert_offsets + expert)
    hi = tl.load(expert_offsets + expert + 1)
    offs_n = ntile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < HIDDEN
    w_base = w2 + expert.to(tl.int64) * stride_we
    m0 = lo
    while m0 < hi:
        pairs = m0 + tl.arange(0, BLOCK_M)
        mask_m = pairs < hi
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < INTER
            a = tl.load(inter + pairs.to(tl.int64)[:, None] * stride_inter + offs_k[None, :],
                        mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(w_base + offs_n[:, None] * stride_wn + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                        other=0.0)
            acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
        weight = tl.load(pair_weight + pairs, mask=mask_m, other=0.0).to(tl.float32)
        dest = tl.load(pair_dest + pairs, mask=mask_m, other=0).to(tl.int64)
        tl.store(y + dest[:, None] * stride_y + offs_n[None, :], (acc * weight[:, None]).to(y.dtype.element_ty),
                 mask=mask_m[:, None] & mask_n[None, :])
        m0 += BLOCK_M


def sort_pairs_by_expert(ids: torch.Tensor, num_experts: int):
    """(order, token_of_pair, expert_offsets [E+1]) for the flattened (token, choice) pairs, on the device."""
    flat = ids.flatten()
    sorted_ids, order = flat.sort(stable=True)
    bounds = torch.arange(num_experts + 1, device=ids.device, dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds).to(torch.int32)
    return order, (order // ids.shape[1]).to(torch.int32), offsets


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                ids: torch.Tensor) -> torch.Tensor:
    """Same contract as the reference: x [T, H]; w13 [E, 2I, H]; w2 [E, H, I]; weights/ids [T, k]."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    tokens, hidden = x.shape
    experts, inter_size = w13.shape[0], w13.shape[1] // 2
    top_k = ids.shape[1]
    if tokens == 0:
        return torch.zeros_like(x)
    assert w13.stride(-1) == 1 and w2.stride(-1) == 1
    order, token_of_pair, offsets = sort_pairs_by_expert(ids, experts)
    pair_weight = weights.flatten()[order].float()
    pairs = tokens * top_k
    small = pairs <= 2 * experts  # decode-sized: a few pairs per expert, many experts
    block_m = 16 if small else 64
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    inter = torch.empty((pairs, inter_size), dtype=x.dtype, device=x.device)
    bn, bk = (32, 128) if small else (64, 64)
    _moe_gate_up_kernel[(experts, triton.cdiv(inter_size, bn))](
        x, w13, token_of_pair, offsets, inter, x.stride(0), w13.stride(0), w13.stride(1), inter.stride(0),
        HIDDEN=hidden, INTER=inter_size, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, PRECISION=precision,
        num_warps=4, num_stages=3,
    )
    y = torch.empty((pairs, hidden), dtype=x.dtype, device=x.device)
    bn, bk = (64, 128) if small else (64, 64)
    _moe_down_kernel[(experts, triton.cdiv(hidden, bn))](
        inter, w2, pair_weight, order, offsets, y, inter.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
        HIDDEN=hidden, INTER=inter_size, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, PRECISION=precision,
        num_warps=4, num_stages=3,
    )
    return torch.sum(y.view(tokens, top_k, hidden), dim=1, dtype=torch.float32).to(x.dtype)
