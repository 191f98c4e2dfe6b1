"""Chunked gated delta rule for prefill over a ragged batch: the reference `chunk_gated_delta_rule` in
Triton, with every intermediate in fp32.

Each sequence is cut into chunks of CHUNK rows from its first row. Per chunk and value head h, with
q, k L2-normalised (q also scaled by Dk^-1/2), g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
and G the running sum of g inside the chunk:
    A = strictly lower (beta_i exp(G_i - G_j) k_i.k_j),  T = (I + A)^-1   (the WY / UT transform)
    u = T (beta v),  w = T (beta exp(G) k),  Aqk = lower incl. diagonal (exp(G_i - G_j) q_i.k_j)
and, carrying the state S [Dk, Dv] from chunk to chunk:
    v_new = u - w S;  o = exp(G) q S + Aqk v_new;  S <- exp(G_last) S + (exp(G_last - G) k)^T v_new.

1. `_chunk_prepare_kernel`, one program per (chunk, value head), all chunks at once: everything that
   does not depend on the state (G, w, u, Aqk), written to buffers. T comes from forward substitution in
   registers. q.k and k.k run on the raw inputs (bf16 products are exact) and the norms scale the fp32
   results, so their dots round no normalised copy to 16 bits. Where the state kernel has few programs it
   also writes kd = exp(G_last - G) k, k normalised, the operand of the state update (DECAYED_K), in the
   operand's dtype of that dot.
2. `_chunk_state_kernel`, one program per (sequence, value head, tile of BV state columns): reads its
   state tile from `h_pool[state_slots[b]]`, runs the sequence's chunks in order, writes o, and writes
   the state back in place. For a chunk holding capture rows it also keeps the state before the chunk.
   With split_output (the long passes' default) the output leaves this serial path: the kernel keeps
   the state before every chunk and v_new, and `_chunk_output_kernel`, one program per (chunk, value
   head, tile), then computes o = exp(G) q S + Aqk v_new for every chunk at once (see chunk_gdn).
3. `_chunk_snapshot_kernel`, one program per (capture row r, value head, tile), only when there are
   captures: exp(G_r) S + (exp(G_r - G) k)^T v_new over the chunk's rows up to r, S the state before
   the chunk: the state after r, taken without ending the chunk (the state kernel's loop stays free of
   branches, so it is software-pipelined with or without captures).

The chunk table is found on the device from `query_start_loc` (nothing is read back to the host); the
prepare grid is sized by the bound sum(ceil(len / CHUNK)) <= T // CHUNK + B.
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.capture_rows import as_capture_rows
from deltaserve.kernels.gdn.triton_capture_search import block_caps, captures_before
from deltaserve.kernels.norm.gated_norm import GatedNorm
from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm
from deltaserve.kernels.sm_count import num_sms

CHUNK = 64
# State columns per program of the output kernel (split_output): 128 took 131 against 140 us with 64 at 8192
# tokens, 507 against 550 at 32768, 293 against 321 over 128 prompts of 128 (H200, Qwen3.5 GDN shape,
# gdn_prefill_kernels_same_machine.json); 8 warps measured slower (kernels_check_gdn_long_pass_state.json).
OUTPUT_BLOCK_V = 128
# The prepare kernel on the long passes of 16-bit inputs: tf32 for w and u and 8-row diagonal blocks in the
# inverse took it from 535 to 385 us on one 8192-token prompt of the Qwen3.5 shapes on the H200 (relative
# error of o 4.1e-3 against 3.8e-3; kernels_check_gdn_prefill.json, gdn_prefill_tiles_8192).
# 8 warps took 708 us and w and u in 64-column tiles 393 (kernels_check_gdn_prepare_tiles.json).
# At 175 registers two of its 4-warp programs share a multiprocessor; capped at 168, three, and it took 313
# against 385 us at 8192 tokens, 1255 against 1491 at 32768 and 639 against 781 over 128 prompts of 128
# tokens, with the same output (kernels_check_occupancy.json, gdn_prefill_occupancy_*). The inverse's series
# as a product (_unit_lower_inverse) took it from 302.5 to 292.0 us at 8192, 1214 to 1181 at 32768 and 621 to
# 604 over 128 prompts of 128 (gdn_prefill_kernels_same_machine.json).
LONG_PASS_PREPARE = {"sub": 8, "precision": "tf32", "maxnreg": 168}
# On short passes (chunk 16), 4-row diagonal blocks: forward substitution over 3 rows instead of 15, the
# rest in three small dots. The prepare kernel of an 80-row pass took 8.4 us against 11.5, with the same
# errors (H200, kernels_check_short_pass_tiles.json, gdn_short_pass_80).
SHORT_PASS_PREPARE = {"sub": 4}
# The state kernel's programs walk their sequence's chunks in order, one program a multiprocessor (its two
# stages take 196 KB of shared memory). One long prompt has few sequences to spread, so 32-column tiles
# give the GPU twice the programs: 742 us against 774 with 64 at 8192 tokens. Once the 64-column tiles
# alone fill the multiprocessors they win, each reading a chunk's w, q and k for twice the columns:
# 1040 against 1739 us over 128 prompts of 128 tokens, 268 against 440 over 32 (kernels_check_occupancy.json).
# Not with captures: that kernel's wide tiles spill registers on sm_90, and were not measured. Under the long
# passes' bf16 dots, 16-column tiles (two programs a multiprocessor) took 393-425 us against 258 at 8192
# tokens and 1564-1964 against 1014-1138 at 32768 (gdn_state_tiles.json).
STATE_BLOCK_V = 32
STATE_WIDE_BLOCK_V = 64
# Long passes of 16-bit inputs: bf16 dots on the state, the output in its own kernel, and the buffers
# between the kernels in bf16 (see chunk_gdn), 4 warps; 3 stages on the narrow tiles, 2 on the wide. H200,
# Qwen3.5 GDN shape, the engine's input layout (gdn_prefill_kernels_same_machine.json): the chunk kernels took
# 681 us against 1057 for tf32 dots with the output on the serial path at 8192 tokens, 2701 against 4205 at
# 32768 and 1412 against 1714 over 128 prompts of 128 tokens. Relative errors 6.8e-3 (output) and 3.1e-3
# (state) against 4.1e-3 and 1.3e-3 on the same inputs at 8192 (kernels_check_gdn_long_pass_state.json,
# where the bf16 buffers alone took the state kernel at 8 warps from 350 to 276 us, the same bytes out;
# 8 warps, or 3 stages on the wide tiles, measured slower).
LONG_PASS_STATE = {"precision": "bf16", "split_output": True, "num_warps": 4}
# Whether the output kernel applies a given output_norm in its last store (each program holds a head's whole row
# of o) rather than the gated norm's own kernel after it: the norm's read and write of o leave the pass, a read of
# the gate joins the output kernel, whose registers grow from 146 to 196 a thread (sm_90 compile). Off: timed on an
# H100 (benchmarks/prefill_fusions.py, prefill_fusions_h100_at_daa9d70.json) the chunk kernels and the norm took
# 755.7 / 804.3 / 3055.4 / 2969.8 us against 759.1 / 800.3 / 3029.0 / 2990.0 fused (8192 and 32768 tokens in one
# and in 64 prompts; the same bytes out): the norm's 68-269 us come back as a slower output kernel. Fused at 8
# output warps they took 735.1 / 798.4 / 2970.2 / 2932.7; the unfused output kernel at 8 warps is not yet timed.
FUSED_OUTPUT_NORM = False
LONG_PASS_STAGES = {STATE_BLOCK_V: 3, STATE_WIDE_BLOCK_V: 2}


@triton.jit
def _chunk_counts(query_start_loc, lanes, live, CHUNK: tl.constexpr):
    """(first row, end, chunk count) of the sequences `lanes` where `live` (zeros elsewhere)."""
    starts = tl.load(query_start_loc + lanes, mask=live, other=0)
    ends = tl.load(query_start_loc + 1 + lanes, mask=live, other=0)
    return starts, ends, (ends - starts + CHUNK - 1) // CHUNK


@triton.jit
def _chunk_of(cid, query_start_loc, num_seqs, CHUNK: tl.constexpr, BLOCK_B: tl.constexpr):
    """(first row, row count, found) of global chunk `cid`, chunks numbered sequence by sequence."""
    lanes = tl.arange(0, BLOCK_B)
    starts, ends, counts = _chunk_counts(query_start_loc, lanes, lanes < num_seqs, CHUNK)
    through = tl.cumsum(counts, 0)  # chunks of sequences 0..b
    seq = tl.sum((through <= cid).to(tl.int32), 0)
    found = cid < tl.sum(counts, 0)
    at = lanes == seq
    first_chunk = tl.sum(tl.where(at, through - counts, 0), 0)
    row0 = tl.sum(tl.where(at, starts, 0), 0) + (cid - first_chunk) * CHUNK
    rows = tl.minimum(tl.sum(tl.where(at, ends, 0), 0) - row0, CHUNK)
    return row0, rows, found


@triton.jit
def _first_chunk(seq, query_start_loc, CHUNK: tl.constexpr, BLOCK_B: tl.constexpr):
    """The global index of sequence `seq`'s first chunk (the chunks of the sequences before it)."""
    lanes = tl.arange(0, BLOCK_B)
    return tl.sum(_chunk_counts(query_start_loc, lanes, lanes < seq, CHUNK)[2], 0)


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr):
    """a @ b + acc in fp32; PRECISION "bf16" rounds both operands to bf16 first, else it is tl.dot's
    input precision for the operands in fp32 (a 16-bit buffer's operand widened)."""
    if PRECISION == "bf16":
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PRECISION)
    return out


@triton.jit
def _unit_lower_inverse(A, CHUNK: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr):
    """(I + A)^-1 for A [CHUNK, CHUNK] strictly lower triangular, in diagonal blocks of SUB rows.

    The diagonal blocks are inverted together by forward substitution in fp32 (SUB - 1 steps, row s of
    every block at once): D = (I + A_diag)^-1. With L the blocks below the diagonal,
    I + A = (I + A_diag)(I + M) for M = D L, strictly block-lower, so M^NB = 0 and
    (I + A)^-1 = (I - M + M^2 - ...) D; the correction has no diagonal blocks, so D's stay exact. The
    sum of the NB powers is the product (I - M)(I + M^2)(I + M^4)...: log2(NB) factors, 2 log2(NB) - 2
    dots of which each square and the product before it are independent, where the powers one by one
    are NB - 2 dots in a chain."""
    NB: tl.constexpr = CHUNK // SUB
    rows = tl.arange(0, CHUNK)
    block_i = tl.arange(0, NB)[:, None, None, None]
    block_j = tl.arange(0, NB)[None, None, :, None]
    A_diag = tl.sum(tl.where(block_i == block_j, tl.reshape(A, [NB, SUB, NB, SUB]), 0.0), 2)  # [NB, SUB, SUB]
    r = tl.arange(0, SUB)
    row_is = r[None, :, None]
    D = tl.where(row_is == r[None, None, :], 1.0, 0.0) + tl.zeros([NB, SUB, SUB], dtype=tl.float32)
    for s in range(1, SUB):  # row s of each block: e_s - sum_{j<s} A_sj D_j
        a_s = tl.sum(tl.where(row_is == s, A_diag, 0.0), 1)  # [NB, SUB]: row s of every diagonal block
        D = tl.where(row_is == s, D - tl.sum(a_s[:, :, None] * D, 1)[:, None, :], D)
    D = tl.reshape(tl.where(block_i == block_j, tl.expand_dims(D, 2), 0.0), [CHUNK, CHUNK])
    below = (rows // SUB)[:, None] > (rows // SUB)[None, :]
    power = -tl.dot(D, tl.where(below, A, 0.0), input_precision=PRECISION)  # -M
    series = power  # (I + series) = (I - M), then times (I + M^2), (I + M^4), ...
    for j in tl.static_range(1, 6):  # NB <= 64
        if (1 << j) < NB:
            power = tl.dot(power, power, input_precision=PRECISION)  # (-M)^(2^j)
            series = tl.dot(series, power, series + power, input_precision=PRECISION)  # (I + s)(I + P) - I
    return tl.dot(series, D, D, input_precision=PRECISION)


@triton.jit
def _chunk_prepare_kernel(
    q, k, v, a, b, A_log, dt_bias, query_start_loc, w_buf, u_buf, g_buf, aqk_buf, kd_buf, num_seqs,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_a_t, stride_b_t, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_B: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr,
    INVERSE_PRECISION: tl.constexpr, DECAYED_K: tl.constexpr,
):
    cid, head = tl.program_id(0), tl.program_id(1)
    row0, count, found = _chunk_of(cid, query_start_loc, num_seqs, CHUNK, BLOCK_B)
    if found:
        key_head = head // (HV // HK)
        rows = tl.arange(0, CHUNK)
        cols = tl.arange(0, CHUNK)
        live = rows < count
        t = row0.to(tl.int64) + rows
        offs_k = tl.arange(0, BK)
        mask_qk = live[:, None] & (offs_k < DK)[None, :]

        # gates
        a_t = tl.load(a + t * stride_a_t + head, mask=live, other=0.0).to(tl.float32)
        a_t += tl.load(dt_bias + head).to(tl.float32)
        softplus = tl.where(a_t > 20.0, a_t, tl.log(1.0 + tl.exp(tl.minimum(a_t, 20.0))))
        g = tl.where(live, -tl.exp(tl.load(A_log + head).to(tl.float32)) * softplus, 0.0)
        G = tl.cumsum(g, 0)
        beta = tl.where(live, 1.0 / (1.0 + tl.exp(-tl.load(b + t * stride_b_t + head, mask=live, other=0.0)
                                                   .to(tl.float32))), 0.0)
        tl.store(g_buf + t * HV + head, G, mask=live)

        # q.k and k.k on the raw rows; the L2 norms scale the fp32 results
        kr = tl.load(k + t[:, None] * stride_k_t + key_head * stride_k_h + offs_k[None, :], mask=mask_qk, other=0.0)
        qr = tl.load(q + t[:, None] * stride_q_t + key_head * stride_q_h + offs_k[None, :], mask=mask_qk, other=0.0)
        rk = 1.0 / tl.sqrt(tl.sum(kr.to(tl.float32) * kr.to(tl.float32), 1) + 1e-6)
        rq = 1.0 / tl.sqrt(tl.sum(qr.to(tl.float32) * qr.to(tl.float32), 1) + 1e-6)
        decay = tl.exp(tl.minimum(G[:, None] - G[None, :], 0.0))  # exp(G_i - G_j), used where j <= i
        qk = tl.dot(qr, tl.trans(kr), input_precision=PRECISION)
        on_or_below = (cols[None, :] <= rows[:, None]) & live[:, None]
        aqk = tl.where(on_or_below, qk * (rq * scale)[:, None] * rk[None, :] * decay, 0.0)
        tl.store(aqk_buf + (t[:, None] * HV + head) * CHUNK + cols[None, :], aqk.to(aqk_buf.dtype.element_ty),
                 mask=live[:, None])
        kk = tl.dot(kr, tl.trans(kr), input_precision=PRECISION)
        below = (cols[None, :] < rows[:, None]) & live[:, None]
        A = tl.where(below, kk * (beta * rk)[:, None] * rk[None, :] * decay, 0.0)

        T = _unit_lower_inverse(A, CHUNK, SUB, INVERSE_PRECISION)

        row_scale = beta * tl.exp(G) * rk
        G_last = tl.sum(tl.where(rows == count - 1, G, 0.0), 0)
        decayed = tl.exp(G_last - G) * rk  # the state kernel's k rows: each decayed to the chunk's end
        for k0 in tl.static_range(0, BK, BV):  # w = T (beta exp(G) k), BV columns at a time
            offs_w = k0 + tl.arange(0, BV)
            mask_w = live[:, None] & (offs_w < DK)[None, :]
            kt = tl.load(k + t[:, None] * stride_k_t + key_head * stride_k_h + offs_w[None, :], mask=mask_w, other=0.0)
            w = tl.dot(T, kt.to(tl.float32) * row_scale[:, None], input_precision=PRECISION)
            at = (t[:, None] * HV + head) * DK + offs_w[None, :]
            tl.store(w_buf + at, w.to(w_buf.dtype.element_ty), mask=mask_w)
            if DECAYED_K:
                tl.store(kd_buf + at, (kt.to(tl.float32) * decayed[:, None]).to(kd_buf.dtype.element_ty), mask=mask_w)
        for v0 in tl.static_range(0, DV, BV):  # u = T (beta v)
            offs_v = v0 + tl.arange(0, BV)
            mask_v = live[:, None] & (offs_v < DV)[None, :]
            vt = tl.load(v + t[:, None] * stride_v_t + head * stride_v_h + offs_v[None, :], mask=mask_v, other=0.0)
            u = tl.dot(T, vt.to(tl.float32) * beta[:, None], input_precision=PRECISION)
            tl.store(u_buf + (t[:, None] * HV + head) * DV + offs_v[None, :], u.to(u_buf.dtype.element_ty), mask=mask_v)


@triton.jit
def _normalized_rows(x, t, live, head_offset, offs_k, mask_k, stride_t):
    """Rows t of one head of x, L2-normalised, fp32 [CHUNK, BK]; zero where not live."""
    rows = tl.load(x + t[:, None] * stride_t + head_offset + offs_k[None, :], mask=live[:, None] & mask_k[None, :],
                   other=0.0).to(tl.float32)
    return rows * (1.0 / tl.sqrt(tl.sum(rows * rows, 1) + 1e-6))[:, None]


@triton.jit
def _chunk_step(q, k, kd_buf, w_buf, u_buf, v_new_buf, g_buf, aqk_buf, o, chunk_states, chunk, cap_rows,
                cap_state, state, row0, end, head, key_head, vtile, cap_i, num_caps, offs_k, offs_v, mask_k, mask_v,
                stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_o_t, scale,
                HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, CHUNK: tl.constexpr,
                HAS_CAPTURES: tl.constexpr, SPLIT_OUTPUT: tl.constexpr, PRECISION: tl.constexpr,
                DECAYED_K: tl.constexpr):
    """One chunk (global index `chunk`) through the state tile [BK, BV]: its output rows, or with
    SPLIT_OUTPUT the state before it and v_new (into v_new_buf) for the output kernel; and the state
    after it."""
    rows = tl.arange(0, CHUNK)
    count = tl.minimum(end - row0, CHUNK)
    live = rows < count
    t = row0.to(tl.int64) + rows
    G = tl.load(g_buf + t * HV + head, mask=live, other=0.0)
    G_last = tl.load(g_buf + (row0 + count - 1).to(tl.int64) * HV + head)
    mask_ov = live[:, None] & mask_v[None, :]
    if HAS_CAPTURES:
        # Capture rows in this chunk (no branch, so the loop stays pipelined): the state before the
        # chunk is kept under the index of the chunk's first capture (the captures before the chunk's
        # first row), where `_chunk_snapshot_kernel` finds it afterwards.
        window = cap_i + rows  # at most CHUNK distinct capture rows fall in one chunk
        in_chunk = tl.load(cap_rows + window, mask=window < num_caps, other=2147483647) < row0 + count
        found = tl.sum(in_chunk.to(tl.int32), 0)
        tile = offs_k[:, None] * DV + offs_v[None, :]
        tl.store(cap_state + (cap_i.to(tl.int64) * HV + head) * DK * DV + tile, state,
                 mask=mask_k[:, None] & mask_v[None, :] & (found > 0))
        cap_i += found

    rows_k = (t[:, None] * HV + head) * DK + offs_k[None, :]
    w = tl.load(w_buf + rows_k, mask=live[:, None] & mask_k[None, :], other=0.0)
    u = tl.load(u_buf + (t[:, None] * HV + head) * DV + offs_v[None, :], mask=mask_ov, other=0.0).to(tl.float32)
    v_new = u - _dot(w, state, None, PRECISION)  # what the carried state does not predict

    if SPLIT_OUTPUT:  # the output kernel computes o from the state before the chunk and v_new
        tl.store(chunk_states + (chunk.to(tl.int64) * HV + head) * DK * DV + offs_k[:, None] * DV + offs_v[None, :],
                 state.to(chunk_states.dtype.element_ty), mask=mask_k[:, None] & mask_v[None, :])
        tl.store(v_new_buf + (t[:, None] * HV + head) * DV + offs_v[None, :], v_new.to(v_new_buf.dtype.element_ty),
                 mask=mask_ov)
    else:
        qt = _normalized_rows(q, t, live, key_head * stride_q_h, offs_k, mask_k, stride_q_t)
        qt = qt * (scale * tl.exp(G))[:, None]
        aqk = tl.load(aqk_buf + (t[:, None] * HV + head) * CHUNK + rows[None, :], mask=live[:, None], other=0.0)
        out = _dot(qt, state, None, PRECISION)
        out = _dot(aqk, v_new, out, PRECISION)
        tl.store(o + t[:, None] * stride_o_t + head * DV + offs_v[None, :], out.to(o.dtype.element_ty), mask=mask_ov)

    if DECAYED_K:  # the prepare kernel's kd, straight into the dot
        kd = tl.load(kd_buf + rows_k, mask=live[:, None] & mask_k[None, :], other=0.0)
    else:
        kd = _normalized_rows(k, t, live, key_head * stride_k_h, offs_k, mask_k, stride_k_t)
        kd = kd * tl.exp(G_last - G)[:, None]
    state = _dot(tl.trans(kd), v_new, state * tl.exp(G_last), PRECISION)
    return state, cap_i


@triton.jit
def _chunk_state_kernel(
    q, k, kd_buf, w_buf, u_buf, v_new_buf, g_buf, aqk_buf, h_pool, state_slots, query_start_loc, cap_rows,
    cap_state, o, chunk_states, store_flags, num_caps,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_o_t, stride_h_slot, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_CAPS: tl.constexpr, HAS_CAPTURES: tl.constexpr,
    SPLIT_OUTPUT: tl.constexpr, LOOP_FOR: tl.constexpr, PRECISION: tl.constexpr, DECAYED_K: tl.constexpr,
    STORE_FLAGS: tl.constexpr = False,
):
    seq, head, vtile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    chunk = seq * 0  # the global index of the sequence's first chunk, as the prepare kernel numbers them
    if SPLIT_OUTPUT:  # only the split output's per-chunk states are stored by it
        chunk = _first_chunk(seq, query_start_loc, CHUNK, BLOCK_B)
    key_head = head // (HV // HK)
    start = tl.load(query_start_loc + seq)
    end = tl.load(query_start_loc + seq + 1)
    slot = tl.load(state_slots + seq).to(tl.int64)
    has_slot = slot >= 0  # a negative slot marks a padding row: zero state in, nothing stored
    offs_k = tl.arange(0, BK)
    offs_v = vtile * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]
    h_ptrs = h_pool + slot * stride_h_slot + head * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    state = tl.load(h_ptrs, mask=mask_kv & has_slot, other=0.0).to(tl.float32)

    cap_i = start * 0  # int32 index of the next capture, carried through the chunk loop
    if HAS_CAPTURES:
        cap_i = captures_before(cap_rows, num_caps, start, BLOCK_CAPS)  # the first at or after its first row
    if LOOP_FOR:  # compiled: a for loop, which the pipeliner can prefetch
        for row0 in range(start, end, CHUNK):
            state, cap_i = _chunk_step(
                q, k, kd_buf, w_buf, u_buf, v_new_buf, g_buf, aqk_buf, o, chunk_states, chunk, cap_rows, cap_state,
                state, row0, end, head, key_head, vtile, cap_i, num_caps, offs_k, offs_v, mask_k, mask_v, stride_q_t,
                stride_q_h, stride_k_t, stride_k_h, stride_o_t, scale, HV, DK, DV, CHUNK, HAS_CAPTURES, SPLIT_OUTPUT,
                PRECISION, DECAYED_K)
            chunk += 1
    else:  # the interpreter cannot take loaded bounds in range()
        row0 = start
        while row0 < end:
            state, cap_i = _chunk_step(
                q, k, kd_buf, w_buf, u_buf, v_new_buf, g_buf, aqk_buf, o, chunk_states, chunk, cap_rows, cap_state,
                state, row0, end, head, key_head, vtile, cap_i, num_caps, offs_k, offs_v, mask_k, mask_v, stride_q_t,
                stride_q_h, stride_k_t, stride_k_h, stride_o_t, scale, HV, DK, DV, CHUNK, HAS_CAPTURES, SPLIT_OUTPUT,
                PRECISION, DECAYED_K)
            chunk += 1
            row0 += CHUNK
    stores = has_slot
    if STORE_FLAGS:  # the sequence's own say (a verify chunk's state waits for its verdicts)
        stores = stores & (tl.load(store_flags + seq) != 0)
    tl.store(h_ptrs, state.to(h_pool.dtype.element_ty), mask=mask_kv & stores)


@triton.jit
def _chunk_snapshot_kernel(
    k, w_buf, u_buf, g_buf, query_start_loc, num_seqs, cap_rows, cap_snaps, cap_state, num_caps, h_snapshots,
    stride_k_t, stride_k_h, stride_snap,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_CAPS: tl.constexpr, U_IS_V_NEW: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Per (capture, value head, tile of BV columns): the state after the capture row r,
    exp(G_r) S + (exp(G_r - G) k)^T v_new over the chunk's rows up to r, S the state before the chunk
    (U_IS_V_NEW: u_buf holds the v_new the state kernel stored). The state kernel kept S under the index of the
    chunk's first capture; both find the chunk from query_start_loc alone."""
    cap, head, vtile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r = tl.load(cap_rows + cap)
    lanes = tl.arange(0, BLOCK_B)
    starts = tl.load(query_start_loc + lanes, mask=lanes < num_seqs, other=2147483647)
    seq_start = tl.max(tl.where(starts <= r, starts, 0), 0)  # the first row of r's sequence
    if r < tl.load(query_start_loc + num_seqs):  # rows past the batch (a graph's spare entries): none
        key_head = head // (HV // HK)
        row0 = seq_start + (r - seq_start) // CHUNK * CHUNK
        record = captures_before(cap_rows, num_caps, row0, BLOCK_CAPS)
        last = r - row0
        rows = tl.arange(0, CHUNK)
        live = rows <= last
        t = row0.to(tl.int64) + rows
        offs_k = tl.arange(0, BK)
        offs_v = vtile * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < DK, offs_v < DV
        tile = offs_k[:, None] * DV + offs_v[None, :]
        mask_kv = mask_k[:, None] & mask_v[None, :]
        state = tl.load(cap_state + (record.to(tl.int64) * HV + head) * DK * DV + tile, mask=mask_kv, other=0.0)
        G = tl.load(g_buf + t * HV + head, mask=live, other=0.0)
        G_r = tl.load(g_buf + (row0 + last).to(tl.int64) * HV + head)
        w = tl.load(w_buf + (t[:, None] * HV + head) * DK + offs_k[None, :], mask=live[:, None] & mask_k[None, :],
                    other=0.0)
        u = tl.load(u_buf + (t[:, None] * HV + head) * DV + offs_v[None, :], mask=live[:, None] & mask_v[None, :],
                    other=0.0).to(tl.float32)
        v_new = u if U_IS_V_NEW else u - _dot(w, state, None, PRECISION)
        kt = _normalized_rows(k, t, live, key_head * stride_k_h, offs_k, mask_k, stride_k_t)
        kt = kt * tl.exp(tl.minimum(G_r - G, 0.0))[:, None]
        snap_state = _dot(tl.trans(kt), v_new, state * tl.exp(G_r), PRECISION)
        snap = tl.load(cap_snaps + cap).to(tl.int64)
        tl.store(h_snapshots + snap * stride_snap + head * DK * DV + tile, snap_state.to(h_snapshots.dtype.element_ty),
                 mask=mask_kv)


@triton.jit
def _chunk_output_kernel(
    q, g_buf, aqk_buf, v_new_buf, chunk_states, query_start_loc, o, num_seqs, gate, norm_weight,
    stride_q_t, stride_q_h, stride_o_t, stride_gate_t, stride_gate_h, scale, eps,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_B: tl.constexpr, PRECISION: tl.constexpr, NORM: tl.constexpr,
):
    """Per (chunk, value head, tile of BV columns), all chunks at once: o = exp(G) q S + Aqk v_new, S the
    state before the chunk (what the fused state kernel computes on its serial path). With NORM (one tile
    holds the head's whole row) o leaves gated-normed, `w * o_hat * silu(gate)`, from o rounded to its dtype
    as the unfused norm reads it."""
    cid, head, vtile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row0, count, found = _chunk_of(cid, query_start_loc, num_seqs, CHUNK, BLOCK_B)
    if found:
        key_head = head // (HV // HK)
        rows = tl.arange(0, CHUNK)
        live = rows < count
        t = row0.to(tl.int64) + rows
        offs_k = tl.arange(0, BK)
        offs_v = vtile * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < DK, offs_v < DV
        mask_ov = live[:, None] & mask_v[None, :]
        state = tl.load(chunk_states + (cid.to(tl.int64) * HV + head) * DK * DV + offs_k[:, None] * DV
                        + offs_v[None, :], mask=mask_k[:, None] & mask_v[None, :], other=0.0)
        G = tl.load(g_buf + t * HV + head, mask=live, other=0.0)
        qt = _normalized_rows(q, t, live, key_head * stride_q_h, offs_k, mask_k, stride_q_t)
        qt = qt * (scale * tl.exp(G))[:, None]
        aqk = tl.load(aqk_buf + (t[:, None] * HV + head) * CHUNK + rows[None, :], mask=live[:, None], other=0.0)
        v_new = tl.load(v_new_buf + (t[:, None] * HV + head) * DV + offs_v[None, :], mask=mask_ov, other=0.0)
        out = _dot(qt, state, None, PRECISION)
        out = _dot(aqk, v_new, out, PRECISION)
        if NORM:
            xf = out.to(o.dtype.element_ty).to(tl.float32)  # zero past DV: v_new and the state load zeros there
            rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 1) / DV + eps)
            g = tl.load(gate + t[:, None] * stride_gate_t + head * stride_gate_h + offs_v[None, :], mask=mask_ov,
                        other=0.0).to(tl.float32)
            w = tl.load(norm_weight + offs_v, mask=mask_v, other=0.0).to(tl.float32)
            out = xf * rstd[:, None] * w[None, :] * (g / (1.0 + tl.exp(-g)))
        tl.store(o + t[:, None] * stride_o_t + head * DV + offs_v[None, :], out.to(o.dtype.element_ty), mask=mask_ov)


def _few_state_programs(seqs: int, hv: int, dv: int, device: torch.device) -> bool:
    """Whether the state kernel's wide tiles would leave multiprocessors idle: one long prompt, or a few."""
    return seqs * hv * triton.cdiv(dv, STATE_WIDE_BLOCK_V) < num_sms(device)


def _state_block_v(seqs: int, hv: int, dv: int, device: torch.device) -> int:
    """The state kernel's columns a program: the wide tiles once their programs fill the multiprocessors."""
    return STATE_BLOCK_V if _few_state_programs(seqs, hv, dv, device) else STATE_WIDE_BLOCK_V


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def chunk_gdn(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, query_start_loc, capture_rows=None,
              h_snapshots=None, block_v: int | None = None, num_warps: int | None = None,
              num_stages: int | None = None, precision: str | None = None, chunk: int = CHUNK,
              split_output: bool | None = None, prepare: dict | None = None,
              buffer_dtype: torch.dtype | None = None, output: dict | None = None,
              u_dtype: torch.dtype | None = None, decayed_k: bool | None = None,
              store_state: torch.Tensor | None = None, output_norm: GatedNorm | None = None,
              fuse_norm: bool | None = None) -> torch.Tensor:
    """Same contract as the reference `chunk_gated_delta_rule`: q,k [T, Hk, Dk]; v [T, Hv, Dv]; a,b [T, Hv];
    h_pool [S, Hv, Dk, Dv] fp32, read and written at state_slots; returns o [T, Hv, Dv] in v's dtype.

    chunk is the rows per chunk (CHUNK; the dispatch gives short passes 16: less work on each chunk's
    serial path). block_v, num_warps and num_stages tune the state kernel; precision is the state and
    output kernels' dot precision: by default "tf32" for 16-bit inputs (relative error ~1e-3, under the
    bf16 rounding of o) and "tf32x3" (about fp32) for fp32 inputs; "bf16" rounds the operands to bf16
    (the state itself stays fp32). `prepare` overrides the prepare kernel's options (LONG_PASS_PREPARE:
    "sub", "precision", "inverse_precision", "warps", "bv", the columns of w and u per dot, and "maxnreg",
    a cap on each thread's registers, which decides how many of its programs share a multiprocessor).
    split_output takes the output off the state kernel's serial path: that kernel keeps the state
    before each chunk and v_new, and `_chunk_output_kernel` computes o for all chunks at once.
    buffer_dtype overrides the dtype of the buffers that only feed dots (w, Aqk, the states before each chunk,
    v_new): by default bf16 under bf16 dots, else fp32. `output` overrides the output kernel's "bv",
    "warps" and "stages". u_dtype stores u in that dtype rather than fp32, off by default: u takes part in
    v_new = u - w S, so a 16-bit u rounds what no dot rounds, and on the H200 bf16 took the chunk kernels
    only from 676 to 652 us at 8192 tokens (kernels_check_rotary_tiles_u_dtype.json). decayed_k overrides
    whether the prepare kernel writes kd for the state kernel (by default where its programs are few).
    store_state, a [B] integer tensor, writes back the final states of the sequences whose entry is not 0 alone
    (None: every one). output_norm: o leaves gated-normed, by the output kernel where it holds a head's whole
    row (split_output) and fuse_norm (FUSED_OUTPUT_NORM by default) says so, else by the gated norm's own kernel.

    Long passes of 16-bit inputs take LONG_PASS_STATE."""
    q, k, v, a, b = (_last_dim_contiguous(x) for x in (q, k, v, a, b))
    assert h_pool.is_contiguous()
    tokens, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    seqs = query_start_loc.shape[0] - 1
    o = torch.empty((tokens, hv, dv), dtype=v.dtype, device=v.device)
    if tokens == 0 or seqs == 0:
        return o
    interpret = not q.is_cuda
    long_16bit_pass = chunk >= CHUNK and not interpret and q.dtype != torch.float32
    prepare = dict(LONG_PASS_PREPARE if long_16bit_pass else SHORT_PASS_PREPARE if chunk < CHUNK else {},
                   **(prepare or {}))
    state_options = LONG_PASS_STATE if long_16bit_pass else {}
    split_output = state_options.get("split_output", False) if split_output is None else split_output
    num_warps = num_warps or state_options.get("num_warps", 4)
    if interpret:
        precision = prepare_precision = inverse_precision = "ieee"
    elif q.dtype == torch.float32:
        precision = prepare_precision = inverse_precision = precision or "tf32x3"
    else:
        # tf32 on the short passes' state (errors ~1e-3, under o's own bf16 rounding); tf32x3 where it is cheap.
        precision = precision or state_options.get("precision", "tf32")
        prepare_precision = prepare.get("precision", "tf32x3")
        inverse_precision = prepare.get("inverse_precision", "tf32")
    block_k = max(16, triton.next_power_of_2(dk))  # tl.dot needs every dimension >= 16
    dev = q.device
    u_buf = torch.empty((tokens, hv, dv), dtype=u_dtype or torch.float32, device=dev)
    g_buf = torch.empty((tokens, hv), dtype=torch.float32, device=dev)
    # A buffer that only ever feeds a dot is stored in the dot's operand dtype: under bf16 dots it is
    # rounded there anyway (the same numbers in half the bytes). u takes part in a subtraction: fp32.
    # Aqk in bf16 took the output kernel from 130.3-130.6 to 113.0-113.2 us and the prepare kernel from
    # 311.0-312.5 to 307.6-307.7 at 8192 tokens, with the same errors against the fp32 reference (H200,
    # Qwen3.5 GDN shape, alternated twice, gdn_prefill_kernels_aqk_narrow_same_machine.json).
    narrow = buffer_dtype or (torch.bfloat16 if precision == "bf16" else torch.float32)
    w_buf = torch.empty((tokens, hv, dk), dtype=narrow, device=dev)
    aqk_buf = torch.empty((tokens, hv, chunk), dtype=narrow, device=dev)
    if decayed_k is None:
        # Where the state kernel has few programs (one or two prompts), its serial chunk loop is the pass's
        # critical path, so the prepare kernel, all chunks at once, writes the state update's operand kd (k
        # normalised and decayed to its chunk's end) and the loop loads it: the state kernel took 202-204
        # against 258 us at 8192 tokens and 783-786 against 1014 at 32768, the prepare kernel 311 against 290 and
        # 1258 against 1175, with the same errors (H200, Qwen3.5 GDN shape, alternated twice,
        # gdn_prefill_kernels_decayed_k_same_machine.json). Once the programs fill the GPU the loop is bound by
        # its throughput, not its chain: with kd over 128 prompts of 128 tokens the state kernel took 479
        # against 510 us and the prepare kernel 639 against 597
        # (gdn_prefill_kernels_decayed_k_everywhere_same_machine.json), so those passes normalise k in the loop.
        decayed_k = _few_state_programs(seqs, hv, dv, dev)
    kd_buf = torch.empty((tokens, hv, dk), dtype=narrow, device=dev) if decayed_k else w_buf  # else unused
    max_chunks = tokens // chunk + seqs
    _chunk_prepare_kernel[(max_chunks, hv)](
        q, k, v, a, b, A_log, dt_bias, query_start_loc, w_buf, u_buf, g_buf, aqk_buf, kd_buf, seqs,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        dk**-0.5, HK=hk, HV=hv, DK=dk, DV=dv, BK=block_k, BV=prepare.get("bv", 32), CHUNK=chunk,
        BLOCK_B=max(16, triton.next_power_of_2(seqs)),
        SUB=min(prepare.get("sub", 16), chunk), PRECISION=prepare_precision, INVERSE_PRECISION=inverse_precision,
        DECAYED_K=decayed_k, num_warps=prepare.get("warps", 4), num_stages=1, maxnreg=prepare.get("maxnreg"),
    )
    has_captures = bool(capture_rows) and h_snapshots is not None
    block_v = block_v or (STATE_BLOCK_V if has_captures else _state_block_v(seqs, hv, dv, dev))
    block_v = max(16, min(block_v, triton.next_power_of_2(dv)))
    num_stages = num_stages or (LONG_PASS_STAGES.get(block_v, 2) if long_16bit_pass else 2)
    num_caps = 0
    cap_rows = cap_snaps = cap_state = state_slots  # unused placeholders
    if has_captures:
        assert h_snapshots.is_contiguous()
        # No launch besides the kernels' own: each finds a capture's chunk from the table itself (a
        # search, a copy and two fills per layer were 4 us of a short pass's ~45 per GDN layer on the H200).
        cap_rows, cap_snaps, repeats = as_capture_rows(capture_rows).distinct_rows(dev)
        num_caps = cap_rows.shape[0]
        cap_state = torch.empty((num_caps, hv, dk, dv), dtype=torch.float32, device=dev)
    split = bool(split_output)
    block_b = max(16, triton.next_power_of_2(seqs))
    caps_block = block_caps(num_caps)
    chunk_states = torch.empty((max_chunks, hv, dk, dv), dtype=narrow, device=dev) if split else w_buf
    v_new_buf = torch.empty((tokens, hv, dv), dtype=narrow, device=dev) if split else u_buf
    _chunk_state_kernel[(seqs, hv, triton.cdiv(dv, block_v))](
        q, k, kd_buf, w_buf, u_buf, v_new_buf, g_buf, aqk_buf, h_pool, state_slots, query_start_loc, cap_rows,
        cap_state, o, chunk_states, state_slots if store_state is None else store_state, num_caps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), o.stride(0), h_pool.stride(0), dk**-0.5,
        HK=hk, HV=hv, DK=dk, DV=dv, BK=block_k, BV=block_v, CHUNK=chunk, BLOCK_B=block_b, BLOCK_CAPS=caps_block,
        HAS_CAPTURES=has_captures, SPLIT_OUTPUT=split, LOOP_FOR=not interpret, PRECISION=precision,
        DECAYED_K=decayed_k, STORE_FLAGS=store_state is not None, num_warps=num_warps, num_stages=num_stages,
    )
    normed = False
    if split:
        output = output or {}
        block_o = max(16, min(output.get("bv", OUTPUT_BLOCK_V), triton.next_power_of_2(dv)))
        fuse_norm = FUSED_OUTPUT_NORM if fuse_norm is None else fuse_norm
        normed = output_norm is not None and fuse_norm and block_o >= dv
        gate = _last_dim_contiguous(output_norm.gate) if normed else o
        assert gate.shape == o.shape, "the gate comes per head, [T, Hv, Dv]"
        _chunk_output_kernel[(max_chunks, hv, triton.cdiv(dv, block_o))](
            q, g_buf, aqk_buf, v_new_buf, chunk_states, query_start_loc, o, seqs, gate,
            output_norm.weight if normed else o, q.stride(0), q.stride(1), o.stride(0), gate.stride(0), gate.stride(1),
            dk**-0.5, output_norm.eps if normed else 0.0,
            HK=hk, HV=hv, DK=dk, DV=dv, BK=block_k, BV=block_o, CHUNK=chunk, BLOCK_B=block_b,
            PRECISION=precision, NORM=normed, num_warps=output.get("warps", 4), num_stages=output.get("stages", 2),
        )
    if has_captures:
        _chunk_snapshot_kernel[(num_caps, hv, triton.cdiv(dv, block_v))](
            k, w_buf, v_new_buf if split else u_buf, g_buf, query_start_loc, seqs, cap_rows, cap_snaps, cap_state,
            num_caps, h_snapshots,
            k.stride(0), k.stride(1), h_snapshots.stride(0),
            HK=hk, HV=hv, DK=dk, DV=dv, BK=block_k, BV=block_v, CHUNK=chunk, BLOCK_B=block_b, BLOCK_CAPS=caps_block,
            U_IS_V_NEW=split, PRECISION=precision,
            num_warps=4,
        )
        for slot, source in repeats:
            h_snapshots[slot].copy_(h_snapshots[source])
    if output_norm is not None and not normed:
        o = gated_rms_norm(o, *output_norm)
    return o
