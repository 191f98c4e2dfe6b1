"""The decode step's gated delta rule over a 16-bit state, its two reductions on the tensor cores.

triton_recurrent's decode kernel widens its state tile to fp32 on the load and keeps it so until the
store: a bf16 tile takes a 32-bit register a value, as an fp32 tile does, for half the bytes. A
multiprocessor holds as many programs as its registers allow, so a bf16 state kept half the bytes in
flight and moved at 2.8 TB/s where fp32 moved at 3.8 on the H200.

Here S^T q and S^T k are one dot, [q; k; 0 ...] (16 x Dk) times the tile (Dk x BV), on the 16-bit
values as loaded: each product of two bf16 values is exact in fp32, and the dot sums them in fp32 (in
another order than a row sum). Only the update widens the tile, value by value on its way to the store,
so no fp32 copy of it is held: for the Qwen3.5 tile (128 x 64, 4 warps) ptxas gives 80 registers a
thread where the widening kernel takes 128. The dot needs its operands in the state's dtype: q and k
must be too (the engine's are), else triton_recurrent runs.

Each state tile is read once and written once, so on wide steps (STREAMED) the loads and stores are marked
evict-first and the grid runs head first: the programs that run together then read one sequence's heads,
neighbours in memory, rather than one head of many sequences' slots.
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.gdn.triton_recurrent import (_coefficients, _last_dim_contiguous, _load_row, _state_tile,
                                                      grid_of)
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid

DOT_ROWS = 16  # the smallest M of a tensor-core dot: row 0 is q, row 1 is k, the rest zeros


@triton.jit
def _gdn_decode_dot_kernel(
    q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, o,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_a_t, stride_b_t,
    stride_h_slot, stride_o_t, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    ROWS: tl.constexpr, STREAMED: tl.constexpr = False, USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    seq, head, key_head, live, offs_k, offs_v, mask_k, mask_v, mask_kv, h_head = _state_tile(
        h_pool, state_slots, stride_h_slot, HK, HV, DK, DV, BK, BV, GRID="head" if STREAMED else "sequence")
    h_ptrs = h_head + offs_k[:, None] * DV + offs_v[None, :]
    # 16-bit, as stored
    state = tl.load(h_ptrs, mask=mask_kv & live, other=0.0, eviction_policy="evict_first" if STREAMED else "")

    t64 = seq.to(tl.int64)
    qt, kt, vt, at, bt = _load_row(q, k, v, a, b, t64, seq >= 0, head, key_head, offs_k, offs_v, mask_k, mask_v,
                                   stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h,
                                   stride_a_t, stride_b_t)
    decay_rate = -tl.exp(tl.load(A_log + head).to(tl.float32))
    bias = tl.load(dt_bias + head).to(tl.float32)
    decay, beta, rq, rk, qk = _coefficients(qt, kt, at, bt, decay_rate, bias, scale)

    # q and k were loaded in the state's dtype and widened exactly, so narrowing them back loses nothing.
    rows = tl.arange(0, ROWS)[:, None]
    lhs = tl.where(rows == 0, qt[None, :], tl.where(rows == 1, kt[None, :], 0.0)).to(state.dtype)
    sums = tl.dot(lhs, state)  # [ROWS, BV] fp32: row 0 is S^T q, row 1 S^T k
    s_q = tl.sum(tl.where(rows == 0, sums, 0.0), 0) * (rq * scale)
    s_k = tl.sum(tl.where(rows == 1, sums, 0.0), 0) * rk
    delta = (vt - decay * s_k) * beta
    out = decay * s_q + qk * delta
    tl.store(o + t64 * stride_o_t + head * DV + offs_v, out.to(o.dtype.element_ty), mask=mask_v)
    new = state.to(tl.float32) * decay + (kt * rk)[:, None] * delta[None, :]
    tl.store(h_ptrs, new.to(h_pool.dtype.element_ty), mask=mask_kv & live,
             eviction_policy="evict_first" if STREAMED else "")


def decode_dot_tiles(seq_heads: int) -> tuple[int, int, bool]:
    """(block_v, num_warps, streamed) of a decode step with seq_heads (sequence, value head) pairs. H200,
    Qwen3.5 shape (32 value heads, 128 x 128 bf16 states; kernels_check_gdn_decode_dot.json): at 8
    sequences 128-column tiles at 8 warps took 5.9 us against 6.9 at 32 x 4; at 32, 64 x 4 16.9 us
    (128 x 4 18.2); at 64 and 128, 128 x 4 42.3 and 78.6 us against 44.9 and 86.2 at 64 x 4 (the widening
    kernel 50.8 and 96.2). Few sequences keep narrow tiles: programs enough to spread over the machine.
    Streamed, the 128 x 4 tiles took 40.3-40.5 us against 42.0-42.1 at 64 and 75.3-75.8 against
    77.4-77.5 at 128, in two commands (kernels_check_gdn_decode_dot_order*.json), where the head-first
    grid alone took 43.1 and 78.8-79.0 and evict-first alone 40.8-41.0 and 77.9; at 32 sequences its
    64 x 4 tiles measured no faster (17.2 against 16.9 us), so the narrower steps keep the plain form."""
    if seq_heads < 256:
        return 32, 4, False
    if seq_heads < 1024:
        return 128, 8, False
    if seq_heads < 2048:
        return 64, 4, False
    return 128, 4, True


def takes_dot(q: torch.Tensor, k: torch.Tensor, h_pool: torch.Tensor) -> bool:
    """Whether this kernel can run the step: a 16-bit state, and q and k in its dtype."""
    return h_pool.dtype in (torch.bfloat16, torch.float16) and q.dtype == k.dtype == h_pool.dtype


def gdn_decode_dot(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, block_v: int | None = None,
                   num_warps: int | None = None, streamed: bool | None = None) -> torch.Tensor:
    """One token per sequence (row i is sequence i, its state h_pool[state_slots[i]]); q,k [B, Hk, Dk],
    v [B, Hv, Dv], a,b [B, Hv], h_pool [S, Hv, Dk, Dv] contiguous, updated in place (see takes_dot).
    Returns o [B, Hv, Dv] in v's dtype. block_v, num_warps and streamed default to decode_dot_tiles'."""
    assert takes_dot(q, k, h_pool) and h_pool.is_contiguous()
    q, k, v, a, b = (_last_dim_contiguous(x) for x in (q, k, v, a, b))
    seqs, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    o = torch.empty((seqs, hv, dv), dtype=v.dtype, device=v.device)
    if seqs == 0:
        return o
    tiles = decode_dot_tiles(seqs * hv)
    block_v = max(min(block_v or tiles[0], triton.next_power_of_2(dv)), 16)
    streamed = tiles[2] if streamed is None else streamed
    grid = grid_of("head" if streamed else "sequence", seqs, hv, triton.cdiv(dv, block_v))
    _gdn_decode_dot_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, o,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        h_pool.stride(0), o.stride(0), dk**-0.5,
        HK=hk, HV=hv, DK=dk, DV=dv, BK=max(triton.next_power_of_2(dk), 16), BV=block_v, ROWS=DOT_ROWS,
        STREAMED=streamed, num_warps=num_warps or tiles[1], **launch_options(q),
    )
    return o
