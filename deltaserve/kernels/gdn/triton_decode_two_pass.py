"""The decode step's gated delta rule (one token per sequence) streamed through the state in two passes.

triton_recurrent's decode holds a whole [Dk, BV] state tile in registers from its load to its store,
because the update needs S^T k, a sum over all of Dk. What a multiprocessor can have in flight is then
bound by its registers, and a bf16 state brings half the bytes per register: on the H200 the bf16 state
of 128 sequences moved at 2.8 TB/s where fp32 moved at 3.8.

Here each program walks its tile in chunks of BK rows twice. The first pass only reads: S^T q, S^T k and
the q/k sums. The second reads the chunks again (the first pass asked L2 to keep them) and writes
d S + k delta^T. Neither pass holds more than one chunk, so many more programs fit on a multiprocessor.
The arithmetic is that of triton_recurrent._update; only the order of the sums over Dk differs.
A negative slot marks a padding row: it computes on a zero state and stores none.
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid


@triton.jit
def _read_chunk(q_row, k_row, h_tile, c, s_q, s_k, qq, kk, qk, mask_v, live, DK: tl.constexpr,
                DV: tl.constexpr, BK: tl.constexpr):
    """First pass over rows c:c+BK of the tile: adds their part of S^T q, S^T k and the q/k sums."""
    offs_k = c + tl.arange(0, BK)
    mask_k = offs_k < DK
    qc = tl.load(q_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    kc = tl.load(k_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    state = tl.load(h_tile + offs_k[:, None] * DV, mask=(mask_k[:, None] & mask_v[None, :]) & live, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
    s_q += tl.sum(state * qc[:, None], 0)
    s_k += tl.sum(state * kc[:, None], 0)
    return s_q, s_k, qq + tl.sum(qc * qc, 0), kk + tl.sum(kc * kc, 0), qk + tl.sum(qc * kc, 0)


@triton.jit
def _write_chunk(k_row, h_tile, h_pool, c, decay, rk, delta, mask_v, live, DK: tl.constexpr, DV: tl.constexpr,
                 BK: tl.constexpr):
    """Second pass: rows c:c+BK of the tile become decay * S + (k rk) delta^T."""
    offs_k = c + tl.arange(0, BK)
    mask_k = offs_k < DK
    mask_kv = (mask_k[:, None] & mask_v[None, :]) & live
    kc = tl.load(k_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    ptrs = h_tile + offs_k[:, None] * DV
    state = tl.load(ptrs, mask=mask_kv, other=0.0, eviction_policy="evict_first").to(tl.float32)
    state = state * decay + (kc * rk)[:, None] * delta[None, :]
    tl.store(ptrs, state.to(h_pool.dtype.element_ty), mask=mask_kv)


@triton.jit
def _gdn_decode_two_pass_kernel(
    q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, o,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_a_t, stride_b_t,
    stride_h_slot, stride_o_t, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    UNROLL: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    seq, head, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    key_head = head // (HV // HK)
    slot = tl.load(state_slots + seq).to(tl.int64)
    live = slot >= 0
    seq64 = seq.to(tl.int64)
    offs_v = tile * BV + tl.arange(0, BV)
    mask_v = offs_v < DV
    q_row = q + seq64 * stride_q_t + key_head * stride_q_h
    k_row = k + seq64 * stride_k_t + key_head * stride_k_h
    h_tile = h_pool + slot * stride_h_slot + head * DK * DV + offs_v[None, :]

    s_q = tl.zeros([BV], dtype=tl.float32)
    s_k = tl.zeros([BV], dtype=tl.float32)
    qq = tl.sum(s_q, 0) * 0.0  # |q|^2, |k|^2 and q.k as fp32 scalars
    kk = qq
    qk = qq
    if UNROLL:
        for c in tl.static_range(0, DK, BK):
            s_q, s_k, qq, kk, qk = _read_chunk(q_row, k_row, h_tile, c, s_q, s_k, qq, kk, qk, mask_v, live, DK, DV,
                                                   BK)
    else:
        for c in tl.range(0, DK, BK):
            s_q, s_k, qq, kk, qk = _read_chunk(q_row, k_row, h_tile, c, s_q, s_k, qq, kk, qk, mask_v, live, DK, DV,
                                                   BK)

    at = tl.load(a + seq64 * stride_a_t + head).to(tl.float32) + tl.load(dt_bias + head).to(tl.float32)
    bt = tl.load(b + seq64 * stride_b_t + head).to(tl.float32)
    vt = tl.load(v + seq64 * stride_v_t + head * stride_v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    softplus = tl.where(at > 20.0, at, tl.log(1.0 + tl.exp(tl.minimum(at, 20.0))))
    decay = tl.exp(-tl.exp(tl.load(A_log + head).to(tl.float32)) * softplus)
    beta = 1.0 / (1.0 + tl.exp(-bt))
    rq = 1.0 / tl.sqrt(qq + 1e-6)
    rk = 1.0 / tl.sqrt(kk + 1e-6)
    delta = (vt - decay * s_k * rk) * beta
    out = decay * s_q * (rq * scale) + (qk * (rq * rk * scale)) * delta
    tl.store(o + seq64 * stride_o_t + head * DV + offs_v, out.to(o.dtype.element_ty), mask=mask_v)

    if UNROLL:
        for c in tl.static_range(0, DK, BK):
            _write_chunk(k_row, h_tile, h_pool, c, decay, rk, delta, mask_v, live, DK, DV, BK)
    else:
        for c in tl.range(0, DK, BK):
            _write_chunk(k_row, h_tile, h_pool, c, decay, rk, delta, mask_v, live, DK, DV, BK)


def two_pass_tiles(seq_heads: int, state_bytes: int) -> tuple[int, int, int, bool]:
    """(block_v, block_k, num_warps, unroll) for seq_heads (sequence, value head) pairs."""
    return 64, 32, 4, True


def gdn_decode_two_pass(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, block_v: int | None = None,
                        block_k: int | None = None, num_warps: int | None = None,
                        unroll: bool | None = None) -> torch.Tensor:
    """Same contract as triton_recurrent.gdn_recurrent without query_start_loc: row i is sequence i."""
    q, k, v, a, b = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, a, b))
    assert h_pool.is_contiguous()
    tokens, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    o = torch.empty((tokens, hv, dv), dtype=v.dtype, device=v.device)
    if tokens == 0:
        return o
    tiles = two_pass_tiles(tokens * hv, h_pool.element_size())
    block_v = min(block_v or tiles[0], triton.next_power_of_2(dv))
    block_k = min(block_k or tiles[1], triton.next_power_of_2(dk))
    _gdn_decode_two_pass_kernel[(tokens, hv, triton.cdiv(dv, block_v))](
        q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, o,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        h_pool.stride(0), o.stride(0), dk**-0.5,
        HK=hk, HV=hv, DK=dk, DV=dv, BK=block_k, BV=block_v,
        UNROLL=tiles[3] if unroll is None else unroll, num_warps=num_warps or tiles[2], **launch_options(q),
    )
    return o
