"""Causal depthwise conv1d + SiLU over a ragged batch, reading and writing each sequence's conv state.

Tap j of row t reads input row t - (K-1) + j, from x when that row is inside the sequence and from the
old conv state (the last K-1 inputs before it) otherwise. Captured snapshots and the new state are
windows of the same "history" (old state then x).

Short sequences (decode, verify): one program per (sequence, tile of channels) walks its rows, then
gathers the snapshots and the new state; a barrier keeps the in-place state write behind every read
of the old state. Long ones (prefill): the conv runs one program per (run of global rows, tile of
channels), which walks its rows one at a time with the K-1 inputs before the row in registers, so
each input is read once; the per-sequence kernel then only writes the snapshots and the state, after
every read of the old state. (A 2-D tile of rows per program, each tap loaded as its own tile, held
some 170 registers a thread and took 170 us for an 8k-token prompt on the H200, 267 us with the old
state's gathers in every tile; walking the rows took 108 us, kernels_check conv1d_row_tiles, and 101 at
the tiles of ROW_TILES.)
A decode kernel of its own (each channel's old inputs loaded once, no barrier) measured no faster than
the per-sequence kernel at 32-128 sequences (kernels_check_conv1d_decode_kernel.json).
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.capture_rows import as_capture_rows
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid


@triton.jit
def _history(x, conv_state, state_base, end_row, start, channels, mask_c, stride_x, stride_s_c,
             KM1: tl.constexpr, BLOCK_KM1: tl.constexpr):
    """The K-1 inputs ending at row `end_row` (inclusive) as a [BLOCK_C, BLOCK_KM1] tile: column i holds
    input row end_row - (K-2) + i, taken from the old state before the sequence's first row."""
    cols = tl.arange(0, BLOCK_KM1)
    src = end_row - (KM1 - 1) + cols  # global input row of each column
    in_x = src >= start
    col_ok = cols < KM1
    from_x = tl.load(x + src.to(tl.int64)[None, :] * stride_x + channels[:, None],
                     mask=mask_c[:, None] & (in_x & col_ok)[None, :], other=0.0)
    hist_col = src - start + KM1  # column in the old state when src < start
    from_state = tl.load(conv_state + state_base + channels[:, None] * stride_s_c + hist_col[None, :],
                         mask=mask_c[:, None] & (~in_x & col_ok)[None, :], other=0.0)
    return from_x.to(tl.float32) + from_state.to(tl.float32)


@triton.jit
def _conv_silu_rows(x, weight, conv_state, rows, row_ok, start, state_base, live, channels, mask_c,
                    stride_x, stride_s_c, stride_w, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """silu(causal conv) of a [BLOCK_T, BLOCK_C] tile: row r's inputs before its sequence's `start`
    come from the old conv state at `state_base` (one per row; none where not `live`)."""
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(K):
        src = rows - (K - 1) + j
        in_x = src >= start
        xv = tl.load(x + src.to(tl.int64)[:, None] * stride_x + channels[None, :],
                     mask=(row_ok & in_x)[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
        sv = tl.load(conv_state + state_base[:, None] + channels[None, :] * stride_s_c + (src - start + K - 1)[:, None],
                     mask=(row_ok & ~in_x & live)[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
        w = tl.load(weight + channels * stride_w + j, mask=mask_c, other=0.0).to(tl.float32)
        acc += (xv + sv) * w[None, :]
    return acc / (1.0 + tl.exp(-acc))


@triton.jit
def _causal_conv1d_kernel(
    x, weight, conv_state, state_slots, query_start_loc, capture_rows, capture_slots, snapshots, out,
    num_captures, stride_x, stride_out, stride_w, stride_s_slot, stride_s_c, stride_snap_slot, stride_snap_c,
    CHANNELS: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_KM1: tl.constexpr, IS_VARLEN: tl.constexpr, DO_CONV: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    seq, ctile = tl.program_id(0), tl.program_id(1)
    if IS_VARLEN:
        start = tl.load(query_start_loc + seq)
        end = tl.load(query_start_loc + seq + 1)
    else:
        start = seq
        end = seq + 1
    slot = tl.load(state_slots + seq).to(tl.int64)
    live = slot >= 0  # a negative slot marks padding: read a zero state, write none
    state_base = tl.where(live, slot, 0) * stride_s_slot
    channels = ctile * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = (channels < CHANNELS) & live
    mask_cw = channels < CHANNELS

    if DO_CONV:
        t0 = start
        while t0 < end:  # a while loop: the interpreter cannot take loaded bounds in range()
            rows = t0 + tl.arange(0, BLOCK_T)
            row_ok = rows < end
            y = _conv_silu_rows(x, weight, conv_state, rows, row_ok, start, state_base + tl.zeros([BLOCK_T], tl.int64),
                                live, channels, mask_cw, stride_x, stride_s_c, stride_w, K, BLOCK_T, BLOCK_C)
            tl.store(out + rows.to(tl.int64)[:, None] * stride_out + channels[None, :], y.to(out.dtype.element_ty),
                     mask=row_ok[:, None] & mask_cw[None, :])
            t0 += BLOCK_T

    cols = tl.arange(0, BLOCK_KM1)
    i = 0
    while i < num_captures:
        row = tl.load(capture_rows + i)
        if (row >= start) & (row < end):
            snap = tl.load(capture_slots + i).to(tl.int64)
            window = _history(x, conv_state, state_base, row, start, channels, mask_c, stride_x, stride_s_c,
                              K - 1, BLOCK_KM1)
            tl.store(snapshots + snap * stride_snap_slot + channels[:, None] * stride_snap_c + cols[None, :],
                     window.to(snapshots.dtype.element_ty), mask=mask_cw[:, None] & (cols < K - 1)[None, :])
        i += 1
    if end > start:
        final = _history(x, conv_state, state_base, end - 1, start, channels, mask_c, stride_x, stride_s_c,
                         K - 1, BLOCK_KM1)
        tl.debug_barrier()  # every read of the old state above happens before it is overwritten
        tl.store(conv_state + state_base + channels[:, None] * stride_s_c + cols[None, :],
                 final.to(conv_state.dtype.element_ty), mask=mask_c[:, None] & (cols < K - 1)[None, :])


@triton.jit
def _input_row(x, conv_state, src, start, state_base, live, channels, mask_c, stride_x, stride_s_c, KM1: tl.constexpr):
    """Input row `src` of a sequence starting at `start`, fp32 [BLOCK_C]: from x, or from the old state
    (column src - start + K-1) before the sequence's first row; zeros where not live or before the
    state's K-1 inputs."""
    if src >= start:
        row = tl.load(x + src.to(tl.int64) * stride_x + channels, mask=mask_c, other=0.0).to(tl.float32)
    else:
        column = src - start + KM1
        row = tl.load(conv_state + state_base + channels * stride_s_c + column, mask=mask_c & live & (column >= 0),
                      other=0.0).to(tl.float32)
    return row


@triton.jit
def _conv_rows_kernel(
    x, weight, conv_state, state_slots, query_start_loc, out, num_seqs, tokens,
    stride_x, stride_out, stride_w, stride_s_slot, stride_s_c,
    CHANNELS: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """The conv over BLOCK_T consecutive global rows (any mix of sequences) for BLOCK_C channels, one row
    at a time: the inputs before the row stay in registers (h1, h2, h3: lags 1 to 3, so K <= 4) and the
    next row's load is in flight while a row is computed (two rows ahead measured the same on the H200).
    Writes no state."""
    t0 = tl.program_id(0) * BLOCK_T
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = channels < CHANNELS
    # tap weights by lag: w_j multiplies input row t - j (zero past the kernel's K taps)
    w0 = tl.load(weight + channels * stride_w + (K - 1), mask=mask_c, other=0.0).to(tl.float32)
    w1 = tl.load(weight + channels * stride_w + (K - 2), mask=mask_c & (K > 1), other=0.0).to(tl.float32)
    w2 = tl.load(weight + channels * stride_w + (K - 3), mask=mask_c & (K > 2), other=0.0).to(tl.float32)
    w3 = tl.load(weight + channels * stride_w + (K - 4), mask=mask_c & (K > 3), other=0.0).to(tl.float32)
    # the sequence of row t0: the number of sequence ends query_start_loc[1..B] at or before it
    lo, hi = t0 * 0, t0 * 0 + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc + 1 + mid) <= t0:
            lo = mid + 1
        else:
            hi = mid
    seq = tl.minimum(lo, num_seqs - 1)
    start = tl.load(query_start_loc + seq)
    next_start = start * 0 - 1  # negative: the first row loads its lags as a sequence's first row does
    state_base = tl.zeros([], dtype=tl.int64)  # this and the rest: set by the first row
    live = seq >= 0
    h1 = tl.zeros([BLOCK_C], dtype=tl.float32)
    h2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    h3 = tl.zeros([BLOCK_C], dtype=tl.float32)
    x_ptrs = x + t0.to(tl.int64) * stride_x + channels
    x_next = tl.load(x_ptrs, mask=mask_c & (t0 < tokens), other=0.0)
    for i in range(BLOCK_T):  # constant bounds; rows past the last are masked
        t = t0 + i
        in_rows = t < tokens
        xt = x_next.to(tl.float32)
        x_next = tl.load(x_ptrs + (i + 1) * stride_x, mask=mask_c & (t + 1 < tokens) & (i + 1 < BLOCK_T), other=0.0)
        if in_rows & ((t == next_start) | (next_start < 0)):  # a new sequence, or the program's first row
            while tl.load(query_start_loc + seq + 1) <= t:  # past empty sequences
                seq += 1
            start = tl.load(query_start_loc + seq)
            next_start = tl.load(query_start_loc + seq + 1)
            slot = tl.load(state_slots + seq).to(tl.int64)
            live = slot >= 0
            state_base = tl.where(live, slot, 0) * stride_s_slot
            lags = (start, state_base, live, channels, mask_c, stride_x, stride_s_c)
            h1 = _input_row(x, conv_state, t - 1, *lags, K - 1)
            h2 = _input_row(x, conv_state, t - 2, *lags, K - 1)
            h3 = _input_row(x, conv_state, t - 3, *lags, K - 1)
        acc = w0 * xt + w1 * h1 + w2 * h2 + w3 * h3
        y = acc / (1.0 + tl.exp(-acc))
        tl.store(out + t.to(tl.int64) * stride_out + channels, y.to(out.dtype.element_ty), mask=mask_c & in_rows)
        h3, h2, h1 = h2, h1, xt


# The row kernel's (rows, channels, warps) per program. Each warp walks its rows with one row's load in
# flight, so the kernel wants many warps on every multiprocessor: 2 warps a program, and runs short enough
# for 2048 programs. On the H200 at the Qwen3.5 shape's 8192 channels (its conv kernels' time, us;
# conv1d_row_tiles_same_machine.json) against 1 warp and 512 programs: 101.4 against 105.7 for one 8192-token
# prompt, 199.0 against 209.4 for 128 prompts of 128, 54.3 against 81.7 at 4096 tokens and 30.7 against 69.2
# at 2048 (the server's default step: there 512 one-warp programs left most warp slots empty), 16.7 against
# 19.0 at 1000 and 5.5 against 5.8 at 96. 64 rows took 111.8 us at 8192 tokens, 256 rows 162.7 and 128
# channels 149.0 with 1 warp (kernels_check conv1d_row_tiles).
ROW_TILES = (128, 256, 2)
ROW_KERNEL_MAX_K = 4  # its lags are three registers
MIN_ROW_PROGRAMS = 2048


def row_tiles_for(tokens: int, channels: int) -> tuple[int, int, int]:
    """ROW_TILES with fewer rows a program while the grid would have fewer than MIN_ROW_PROGRAMS programs
    (down to 8 rows): a program walks its rows in turn, so a shorter pass (a 2048-token step, a prefix-cache
    hit's tail of some 80 rows) wants many short runs rather than a few long ones."""
    rows, block_c, warps = ROW_TILES
    channel_tiles = triton.cdiv(channels, block_c)
    while rows > 8 and triton.cdiv(tokens, rows) * channel_tiles < MIN_ROW_PROGRAMS:
        rows //= 2
    return rows, block_c, warps


def causal_conv1d(x, weight, conv_state, state_slots, query_start_loc, capture_rows=None, conv_snapshots=None,
                  block_c: int | None = None, block_t: int | None = None,
                  row_tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Same contract as the reference. A graph-captured decode step may pass query_start_loc=None: one row
    per sequence. Giving block_t forces the per-sequence kernel (tests use it to cover both paths);
    row_tiles overrides row_tiles_for (benchmarks sweep it)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    tokens, channels = x.shape
    kernel = weight.shape[1]
    assert conv_state.stride(-1) == 1 and weight.stride(-1) == 1
    seqs = state_slots.shape[0] if query_start_loc is None else query_start_loc.shape[0] - 1
    out = torch.empty((tokens, channels), dtype=x.dtype, device=x.device)
    if tokens == 0 or seqs == 0:
        return out
    captures = as_capture_rows(capture_rows) if conv_snapshots is not None else ()
    if captures:
        cap_rows, cap_slots = captures.all_pairs(x.device)
        snaps = conv_snapshots
    else:
        cap_rows = cap_slots = state_slots
        snaps = conv_state
    max_len = max(tokens - seqs + 1, 1)  # the longest any sequence can be
    by_rows = query_start_loc is not None and max_len > 64 and block_t is None and kernel <= ROW_KERNEL_MAX_K
    if by_rows:
        rows_t, rows_c, rows_warps = row_tiles or row_tiles_for(tokens, channels)
        _conv_rows_kernel[(triton.cdiv(tokens, rows_t), triton.cdiv(channels, rows_c))](
            x, weight, conv_state, state_slots, query_start_loc, out, seqs, tokens,
            x.stride(0), out.stride(0), weight.stride(0), conv_state.stride(0), conv_state.stride(1),
            CHANNELS=channels, K=kernel, BLOCK_T=rows_t, BLOCK_C=rows_c, num_warps=rows_warps,
        )
    if block_t is None:
        block_t = 1 if max_len == 1 else min(32, triton.next_power_of_2(max_len))
    if block_c is None:
        block_c = 256 if block_t <= 4 or by_rows else 64
    grid = (seqs, triton.cdiv(channels, block_c))
    _causal_conv1d_kernel[grid](
        x, weight, conv_state, state_slots, query_start_loc if query_start_loc is not None else state_slots,
        cap_rows, cap_slots, snaps, out, len(captures),
        x.stride(0), out.stride(0), weight.stride(0), conv_state.stride(0), conv_state.stride(1),
        snaps.stride(0), snaps.stride(1),
        CHANNELS=channels, K=kernel, BLOCK_T=block_t, BLOCK_C=block_c,
        BLOCK_KM1=triton.next_power_of_2(max(kernel - 1, 1)), IS_VARLEN=query_start_loc is not None,
        DO_CONV=not by_rows, num_warps=4, **launch_options(x),
    )
    return out
