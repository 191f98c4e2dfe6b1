"""A verify step's GDN states, committed once its verdicts are known: each sequence's state advanced through the
rows it kept, in every GDN layer, in one launch.

A verify graph's token loop (triton_recurrent, store_state=False) reads each sequence's state and computes every
row's output without writing the state back; the rows' k, v, a and b stay in a stash (runner/gdn_stash.py).
Once the sampler has taken its verdicts this kernel reads the state again, runs the kept rows through it with the
token loop's arithmetic and tiles, and writes it back: a state is read twice and written once a step, where
capturing the state after every row and copying the kept one back wrote it k + 1 times, and twice more where a
draft was refuted.

One program per (sequence, value head, layer and tile of BV columns).
"""

import triton
import triton.language as tl

from deltaserve.kernels.gdn.triton_recurrent import _coefficients, ragged_tiles


@triton.jit
def _gdn_commit_kernel(
    k, v, a, b, A_log, dt_bias, h_all, state_slots, row_count, rows_per_seq,
    stride_k_l, stride_k_t, stride_k_h, stride_v_l, stride_v_t, stride_v_h, stride_a_l, stride_a_t,
    stride_b_l, stride_b_t, stride_p_l, stride_h_l, stride_h_slot,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    TILES: tl.constexpr,
):
    seq, head, layer_tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    layer, tile = layer_tile // TILES, layer_tile % TILES
    key_head = head // (HV // HK)
    slot = tl.load(state_slots + seq).to(tl.int64)
    start = seq * rows_per_seq
    end = start + tl.load(row_count + seq)
    offs_k = tl.arange(0, BK)
    offs_v = tile * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :] & (end > start)
    layer64 = layer.to(tl.int64)
    h_head = h_all + layer64 * stride_h_l + slot * stride_h_slot + head * DK * DV
    h_ptrs = h_head + offs_k[:, None] * DV + offs_v[None, :]
    state = tl.load(h_ptrs, mask=mask_kv, other=0.0).to(tl.float32)
    decay_rate = -tl.exp(tl.load(A_log + layer * stride_p_l + head).to(tl.float32))
    bias = tl.load(dt_bias + layer * stride_p_l + head).to(tl.float32)
    k_layer, v_layer = k + layer64 * stride_k_l, v + layer64 * stride_v_l
    a_layer, b_layer = a + layer64 * stride_a_l, b + layer64 * stride_b_l
    t = start
    while t < end:
        t64 = t.to(tl.int64)
        kt = tl.load(k_layer + t64 * stride_k_t + key_head * stride_k_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        vt = tl.load(v_layer + t64 * stride_v_t + head * stride_v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        at = tl.load(a_layer + t64 * stride_a_t + head).to(tl.float32)
        bt = tl.load(b_layer + t64 * stride_b_t + head).to(tl.float32)
        # the token loop's update (triton_recurrent._update) without its output: q is not read
        decay, beta, _, rk, _ = _coefficients(kt, kt, at, bt, decay_rate, bias, 1.0)
        s_k = tl.sum(state * kt[:, None], 0) * rk
        delta = (vt - decay * s_k) * beta
        state = state * decay + (kt * rk)[:, None] * delta[None, :]
        t += 1
    tl.store(h_ptrs, state.to(h_all.dtype.element_ty), mask=mask_kv)


def gdn_commit(k, v, a, b, A_log, dt_bias, h_all, state_slots, row_count, rows_per_seq: int, step_seqs: int) -> None:
    """k [L, T, Hk, Dk], v [L, T, Hv, Dv], a, b [L, T, Hv]: layer l's rows, sequence i's from i * rows_per_seq (a
    verify step's layout); A_log, dt_bias [L, Hv]; h_all [L, S, Hv, Dk, Dv]. Sequence i's state
    h_all[:, state_slots[i]] goes through its first row_count[i] rows (none: untouched). step_seqs: the sequences
    of the verify step whose token loop these rows ran in, whose tiles (ragged_tiles) this takes, so that its sums
    run in the same order."""
    layers, _, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    seqs = state_slots.shape[0]
    if seqs == 0 or layers == 0:
        return
    assert h_all.is_contiguous() and k.stride(-1) == 1 and v.stride(-1) == 1 and A_log.is_contiguous()
    assert dt_bias.stride() == A_log.stride()
    block_v, num_warps, _ = ragged_tiles(step_seqs * hv, h_all.element_size())
    block_v = min(block_v, triton.next_power_of_2(dv))
    tiles = triton.cdiv(dv, block_v)
    _gdn_commit_kernel[(seqs, hv, layers * tiles)](
        k, v, a, b, A_log, dt_bias, h_all, state_slots, row_count, rows_per_seq,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), a.stride(0), a.stride(1),
        b.stride(0), b.stride(1), A_log.stride(0), h_all.stride(0), h_all.stride(1),
        HK=hk, HV=hv, DK=dk, DV=dv, BK=triton.next_power_of_2(dk), BV=block_v, TILES=tiles,
        num_warps=num_warps, num_stages=2,
    )
