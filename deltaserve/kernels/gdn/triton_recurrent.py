"""Gated delta rule, token by token, with the state held in registers: the decode step (one token per
sequence) and a ragged-batch form of the same loop for short prefill passes.

One program per (sequence, value head, tile of Dv columns) loads its fp32 state tile [Dk, BV] from
`h_pool[slot]` once, runs the sequence's tokens through it (gating from the raw a/b, L2 norm of q/k
and the grouped key head all computed in the loop), and writes the tile back in place. A ragged batch
may name capture rows (the tables of `capture_rows.capture_tables`, as the chunk kernels read them):
the state after such a row is also stored into its snapshot slot. The loop carries the index of the
sequence's next capture, so a capture costs a masked store and no per-row table.

The ragged loop loads row t + 1 before row t updates the state: the loads do not depend on the state,
and waiting on each row's loads in turn cost about 1.2 us per token on the H200.
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.capture_rows import capture_tables
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid


@triton.jit
def _load_row(q, k, v, a, b, t64, live, head, key_head, offs_k, offs_v, mask_k, mask_v,
              stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_a_t, stride_b_t):
    """Row t's raw inputs for one value head, fp32 (zeros where not live). Nothing here waits for them:
    they are first used by the next `_update`."""
    qt = tl.load(q + t64 * stride_q_t + key_head * stride_q_h + offs_k, mask=mask_k & live, other=0.0).to(tl.float32)
    kt = tl.load(k + t64 * stride_k_t + key_head * stride_k_h + offs_k, mask=mask_k & live, other=0.0).to(tl.float32)
    vt = tl.load(v + t64 * stride_v_t + head * stride_v_h + offs_v, mask=mask_v & live, other=0.0).to(tl.float32)
    at = tl.load(a + t64 * stride_a_t + head, mask=live, other=0.0).to(tl.float32)
    bt = tl.load(b + t64 * stride_b_t + head, mask=live, other=0.0).to(tl.float32)
    return qt, kt, vt, at, bt


@triton.jit
def _state_tile(h_pool, state_slots, stride_h_slot, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GRID: tl.constexpr = "sequence"):
    """Where a decode program's tile lies: the program is (sequence, value head, tile of BV columns); its
    state is h_pool[state_slots[seq], head, :, tile], which a padding row (a negative slot) neither reads
    nor writes. GRID names the grid's first axis (see grid_of): "sequence", (sequence, head, tile);
    "head", (head, sequence, tile); "tile", (tile, head, sequence). Returns (seq, head, key_head, live,
    offs_k, offs_v, mask_k, mask_v, mask_kv, h_head), h_head pointing at the head's [DK, DV] state: each
    kernel adds the tile's offsets in its own order, which the compiler keeps (the dot kernel takes 48
    registers at 32 x 4 with its order, 64 with the other's)."""
    seq, head, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # The ids are read in the plain order and again in the branches, as in the kernels that were measured:
    # ptxas allocates otherwise when each branch reads them once (178 against 168 registers, dot kernel).
    if GRID == "head":
        seq, head = tl.program_id(1), tl.program_id(0)
    elif GRID == "tile":
        tile, head, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    key_head = head // (HV // HK)
    slot = tl.load(state_slots + seq).to(tl.int64)
    live = slot >= 0
    offs_k = tl.arange(0, BK)
    offs_v = tile * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]
    h_head = h_pool + slot * stride_h_slot + head * DK * DV
    return seq, head, key_head, live, offs_k, offs_v, mask_k, mask_v, mask_kv, h_head


@triton.jit
def _coefficients(qt, kt, at, bt, decay_rate, bias, scale):
    """A token's scalars: the decay d = exp(-exp(A_log) softplus(a + dt_bias)), beta = sigmoid(b), the
    reciprocal norms of q and k, and q.k of the normalised rows times the scale."""
    at += bias
    softplus = tl.where(at > 20.0, at, tl.log(1.0 + tl.exp(tl.minimum(at, 20.0))))
    decay = tl.exp(decay_rate * softplus)
    beta = 1.0 / (1.0 + tl.exp(-bt))
    rq = 1.0 / tl.sqrt(tl.sum(qt * qt, 0) + 1e-6)
    rk = 1.0 / tl.sqrt(tl.sum(kt * kt, 0) + 1e-6)
    qk = tl.sum(qt * kt, 0) * (rq * rk * scale)
    return decay, beta, rq, rk, qk


@triton.jit
def _update(o, state, qt, kt, vt, at, bt, t64, head, decay_rate, bias, scale, offs_v, mask_v, stride_o_t,
            DV: tl.constexpr):
    """One token through the state tile; returns the new tile. With q, k normalised, S' = d S + k delta^T,
    delta = beta (v - d S^T k) and o = S'^T q = d S^T q + (q.k) delta. Every reduction (|q|, |k|, q.k,
    S^T q, S^T k) is taken on the raw rows and the old state at once, so one reduction's latency is on
    each token's path instead of several in a row."""
    decay, beta, rq, rk, qk = _coefficients(qt, kt, at, bt, decay_rate, bias, scale)
    s_q = tl.sum(state * qt[:, None], 0) * (rq * scale)
    s_k = tl.sum(state * kt[:, None], 0) * rk
    delta = (vt - decay * s_k) * beta
    out = decay * s_q + qk * delta
    tl.store(o + t64 * stride_o_t + head * DV + offs_v, out.to(o.dtype.element_ty), mask=mask_v)
    return state * decay + (kt * rk)[:, None] * delta[None, :]


@triton.jit
def _capture(state, t, cap_rows, cap_snaps, cap_i, num_caps, h_snapshots, stride_snap_slot, head, tile_offs,
             mask_kv, DK: tl.constexpr, DV: tl.constexpr):
    """Stores the state after row t when t is the next capture row; returns the next capture's index."""
    hit = tl.load(cap_rows + cap_i, mask=cap_i < num_caps, other=-1) == t
    snap = tl.load(cap_snaps + cap_i, mask=hit, other=0).to(tl.int64)
    tl.store(h_snapshots + snap * stride_snap_slot + head * DK * DV + tile_offs,
             state.to(h_snapshots.dtype.element_ty), mask=mask_kv & hit)
    return cap_i + hit.to(tl.int32)


@triton.jit
def _gdn_recurrent_kernel(
    q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, query_start_loc, cap_rows, cap_snaps, cap_first,
    h_snapshots, o, store_flags, num_caps,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_a_t, stride_b_t,
    stride_h_slot, stride_snap_slot, stride_o_t, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_CAPTURES: tl.constexpr,
    STREAMED: tl.constexpr = False, USE_PDL: tl.constexpr = False, STORE_STATE: tl.constexpr = True,
    STORE_FLAGS: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    seq, head, key_head, live, offs_k, offs_v, mask_k, mask_v, mask_kv, h_head = _state_tile(
        h_pool, state_slots, stride_h_slot, HK, HV, DK, DV, BK, BV, GRID="tile" if STREAMED else "sequence")
    tile_offs = offs_k[:, None] * DV + offs_v[None, :]
    h_ptrs = h_head + tile_offs
    state = tl.load(h_ptrs, mask=mask_kv & live, other=0.0,
                    eviction_policy="evict_first" if STREAMED else "").to(tl.float32)

    decay_rate = -tl.exp(tl.load(A_log + head).to(tl.float32))
    bias = tl.load(dt_bias + head).to(tl.float32)
    if IS_VARLEN:
        start = tl.load(query_start_loc + seq)
        end = tl.load(query_start_loc + seq + 1)
        cap_i = start * 0  # int32 index of the sequence's next capture
        if HAS_CAPTURES:
            cap_i = tl.load(cap_first + seq)
        # Row t + 1 is loaded before row t updates the state, so the loads' latency hides behind it.
        qt, kt, vt, at, bt = _load_row(q, k, v, a, b, start.to(tl.int64), start < end, head, key_head, offs_k,
                                       offs_v, mask_k, mask_v, stride_q_t, stride_q_h, stride_k_t, stride_k_h,
                                       stride_v_t, stride_v_h, stride_a_t, stride_b_t)
        t = start
        while t < end:  # a while loop: the interpreter cannot take loaded bounds in range()
            nq, nk, nv, na, nb = _load_row(q, k, v, a, b, t.to(tl.int64) + 1, t + 1 < end, head, key_head, offs_k,
                                           offs_v, mask_k, mask_v, stride_q_t, stride_q_h, stride_k_t, stride_k_h,
                                           stride_v_t, stride_v_h, stride_a_t, stride_b_t)
            state = _update(o, state, qt, kt, vt, at, bt, t.to(tl.int64), head, decay_rate, bias, scale, offs_v,
                            mask_v, stride_o_t, DV)
            if HAS_CAPTURES:
                cap_i = _capture(state, t, cap_rows, cap_snaps, cap_i, num_caps, h_snapshots, stride_snap_slot,
                                 head, tile_offs, mask_kv, DK, DV)
            qt, kt, vt, at, bt = nq, nk, nv, na, nb
            t += 1
    else:
        t64 = seq.to(tl.int64)
        qt, kt, vt, at, bt = _load_row(q, k, v, a, b, t64, seq >= 0, head, key_head, offs_k, offs_v, mask_k, mask_v,
                                       stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h,
                                       stride_a_t, stride_b_t)
        state = _update(o, state, qt, kt, vt, at, bt, t64, head, decay_rate, bias, scale, offs_v, mask_v,
                        stride_o_t, DV)
    if STORE_STATE:
        stores = live
        if STORE_FLAGS:  # the sequence's own say (a verify chunk's state waits for its verdicts)
            stores = stores & (tl.load(store_flags + seq) != 0)
        tl.store(h_ptrs, state.to(h_pool.dtype.element_ty), mask=mask_kv & stores,
                 eviction_policy="evict_first" if STREAMED else "")


def decode_tiles(seq_heads: int, state_bytes: int) -> tuple[int, int, bool]:
    """(block_v, num_warps, streamed) of a decode step with seq_heads (sequence, value head) pairs: enough
    programs to fill the machine at small batch, wider tiles as the batch grows. From 32 sequences of
    the Qwen3.5 shape (32 value heads, 128 x 128 states) 64-column tiles read the state fastest on the
    H200: fp32 state 37.6 / 72.5 / 141.3 us at 32 / 64 / 128 sequences (3.8 TB/s) against 41.8 / 83.1 /
    164.3 with 32 columns and 4 warps; a bf16 state with 2 warps 19.2 / 50.8 / 96.5 against 26.0 / 66.1
    / 147.7 (kernels_check gdn_decode_tiles). Two ways of keeping more of the state in flight measured
    slower at every batch and dtype: two passes over the tile in chunks, the second reading them back
    from L2 (151.5 / 131.6 us for 128 fp32 / bf16 states, kernels_check_gdn_decode_two_pass.json), and a
    persistent grid prefetching its next tiles through shared memory (166.2 / 115.8 us,
    kernels_check_gdn_decode_persistent.json). A bf16 state whose q and k are bf16 too, as the engine's
    are, decodes in triton_recurrent_dot instead (78.6 us at 128 sequences).

    Streamed (an fp32 state, from 64 sequences), the grid runs tile, head, sequence first, so that the
    programs running together read one sequence's neighbouring heads, and the state is loaded and stored
    evict-first, each byte being read and written once: fp32 64 x 4 tiles took 138.5-138.7 against 141.9
    us at 128 sequences and 70.4-70.5 against 72.4 at 64; the grid order alone 139.3-139.4 and 72.2,
    evict-first alone 143.6-144.0 and 72.4 (kernels_check_gdn_decode_streamed_fp32.json, each timed
    twice, at 7150341, which could run the two apart); the 9B engine's steps 9.41-9.43 against 9.46-9.47
    ms at C=128 (engine_qwen3.5-9b_fp32_state_streamed_same_machine.json). At 32 sequences it took 36.9
    against 37.6 us, not timed in the engine, so those steps keep the plain form, as a 16-bit state does
    here (the engine's take triton_recurrent_dot, which streams its own way)."""
    if seq_heads < 256:
        return 16, 2, False
    if seq_heads < 1024:
        return 32, 4, False
    return 64, 4 if state_bytes >= 4 else 2, seq_heads >= 2048 and state_bytes >= 4


def ragged_tiles(seq_heads: int, state_bytes: int) -> tuple[int, int, bool]:
    """(block_v, num_warps, streamed) of a ragged pass with seq_heads (sequence, value head) pairs. A few
    sequences are bound by each token's latency: narrow tiles, one warp (kernels_check gdn_short_pass). Many
    short ones (a speculative verify pass, k + 1 rows a sequence) fill the machine as a decode step does, and
    take its tiles, unstreamed: the 9B engine's verify graph of 64 sequences of 3 rows took 14.2 ms with 32 x 4
    tiles and 17.7 with 16 x 2 against 27.6 with 8 x 1, of 16 sequences 9.05 / 9.58 / 9.91 ms (H100,
    verify_gdn_ab_qwen3.5-9b_h100.json); the decode tiles, 64 x 4 at 64 sequences, 13.8 against 14.3 ms with
    32 x 4 (verify_gdn_ab_qwen3.5-9b_ragged_tiles_h100.json)."""
    if seq_heads < 256:
        return 8, 1, False
    return *decode_tiles(seq_heads, state_bytes)[:2], False


def grid_of(first: str, seqs: int, heads: int, tiles: int) -> tuple[int, int, int]:
    """A decode kernel's grid with `first` ("sequence", "head" or "tile") on its first axis, the one the
    hardware walks fastest (_state_tile reads it back the same way)."""
    return {"sequence": (seqs, heads, tiles), "head": (heads, seqs, tiles), "tile": (tiles, heads, seqs)}[first]


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def gdn_recurrent(
    q, k, v, a, b, A_log, dt_bias, h_pool, state_slots,
    query_start_loc: torch.Tensor | None = None,
    capture_rows=None,
    h_snapshots: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    streamed: bool | None = None,
    store_state: bool | torch.Tensor = True,
) -> torch.Tensor:
    """q,k [T, Hk, Dk]; v [T, Hv, Dv]; a,b [T, Hv]; h_pool [S, Hv, Dk, Dv] updated in place.

    Without query_start_loc each row is its own sequence (decode); with it, sequence i owns rows
    query_start_loc[i]:query_start_loc[i+1], and capture_rows ((row, snapshot slot) pairs, or a
    CaptureRows) names the rows whose state is also stored into h_snapshots. Returns o [T, Hv, Dv] in
    v's dtype. A decode step's block_v, num_warps and streamed default to decode_tiles' choice for its size.
    store_state=False leaves h_pool as it was (a verify step whose states triton_commit advances later); a [B]
    integer tensor leaves it so for the sequences whose entry is 0.
    """
    q, k, v, a, b = (_last_dim_contiguous(x) for x in (q, k, v, a, b))
    assert h_pool.is_contiguous()
    tokens, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    seqs = state_slots.shape[0] if query_start_loc is None else query_start_loc.shape[0] - 1
    o = torch.empty((tokens, hv, dv), dtype=v.dtype, device=v.device)
    if seqs == 0 or tokens == 0:
        return o
    block_k = triton.next_power_of_2(dk)
    varlen = query_start_loc is not None
    state_bytes = h_pool.element_size()
    tiles = ragged_tiles(seqs * hv, state_bytes) if varlen else decode_tiles(seqs * hv, state_bytes)
    block_v = min(block_v or tiles[0], triton.next_power_of_2(dv))
    num_warps = num_warps or tiles[1]
    streamed = tiles[2] if streamed is None else streamed and not varlen
    has_captures = varlen and h_snapshots is not None and bool(capture_rows)
    store_flags = store_state if isinstance(store_state, torch.Tensor) else state_slots  # else unused
    num_caps, repeats = 0, []
    cap_rows = cap_snaps = cap_first = state_slots  # unused placeholders
    if has_captures:
        assert h_snapshots.is_contiguous()
        cap_rows, cap_snaps, cap_first, repeats = capture_tables(capture_rows, query_start_loc)
        num_caps = cap_rows.shape[0]
    grid = grid_of("tile" if streamed else "sequence", seqs, hv, triton.cdiv(dv, block_v))
    _gdn_recurrent_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, h_pool, state_slots,
        query_start_loc if query_start_loc is not None else state_slots, cap_rows, cap_snaps, cap_first,
        h_snapshots if has_captures else h_pool, o, store_flags, num_caps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        h_pool.stride(0), h_snapshots.stride(0) if has_captures else 0, o.stride(0), dk**-0.5,
        HK=hk, HV=hv, DK=dk, DV=dv, BK=block_k, BV=block_v,
        IS_VARLEN=varlen, HAS_CAPTURES=has_captures, STREAMED=streamed, STORE_STATE=store_state is not False,
        STORE_FLAGS=store_flags is not state_slots,
        num_warps=num_warps, num_stages=num_stages or 2, **launch_options(q),
    )
    for slot, source in repeats:
        h_snapshots[slot].copy_(h_snapshots[source])
    return o
