"""Top-p and min-p for rows without top-k, as a floor per row on the order of its scaled logits, found
without sorting the vocabulary; the race kernel (triton_race.py) drops what lies below it as it reads the row.

A row keeps the tokens whose order key (order_key: the float's bits as an int32 that orders as the floats
do, reference.order_keys) is at least its floor. Top-p's floor is the least key c at which the probability
mass strictly above c is under top_p: reference.mask_logits keeps those tokens, except that tokens of equal
value are kept or dropped together here. It is found in PASSES passes over the row, each trying PIVOTS keys
spread evenly over the interval that still holds it and keeping the sixteenth where the mass crosses top_p,
four bits of the key a pass. A pass is a grid of (row, slice) programs, each summing its slice's mass above
every pivot; the next pass's programs read those sums to place their interval, so a pass is one launch.
The first pass also takes each slice's largest logit (the reference of its masses) and its total mass.
Once the interval is narrow, a slice without a key inside it adds its mass above the interval to every
pivot at once. Min-p's floor is the key of max + log(min_p): a token's probability over the best one's is
exp(x - max). Min-p comes first, as in vLLM: top-p's share is of the mass that min-p keeps, which a pass after
the first sums over each slice (once the row's max is known) for the rows with min-p on. Nine reads of a row
replace the sort of the vocabulary."""

import torch
import triton
import triton.language as tl

# Tokens a program reads: rows of the 9B shape's 248320 tokens take 31 slices. At 128 rows the floors took
# 1547 us against 1711 with slices of 4096 tokens and 4 warps (H200, sampling_masks_38cb2fd.json).
SLICE = 8192
NUM_WARPS = 8
PIVOTS = 16
PASSES = 8  # 4 bits of the 32-bit key a pass
KEY_MIN = -(2**31)  # no float's key: below every token, the floor of a row that keeps all
_KEY_MIN = tl.constexpr(KEY_MIN)


@triton.jit
def order_key(v):
    """int32 keys that order as the float32 values v (-inf lowest): reference.order_keys."""
    bits = v.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _scaled_block(x, scale, row, stride_x, start, vocab, BLOCK: tl.constexpr):
    """The row's scaled logits at [start, start + BLOCK) (-inf past the vocabulary)."""
    cols = start + tl.arange(0, BLOCK)
    return tl.load(x + row * stride_x + cols, mask=cols < vocab, other=float("-inf")) * scale


@triton.jit
def _row_sums(slice_max, slice_sum, row, slices, BLOCK_S: tl.constexpr):
    """(max, sum of exp(logit - max), scales) of a row's scaled logits from its slices': a slice's masses are
    relative to its own max, and scales[s] = exp(slice max - row max) (0 for a slice of -inf only) puts them
    on the row's."""
    offs = tl.arange(0, BLOCK_S)
    live = offs < slices
    maxes = tl.load(slice_max + row * slices + offs, mask=live, other=float("-inf"))
    best = tl.max(maxes, 0)
    scales = tl.where(maxes > float("-inf"), tl.exp(maxes - best), 0.0)
    return best, tl.sum(tl.load(slice_sum + row * slices + offs, mask=live, other=0.0) * scales, 0), scales


@triton.jit
def _row_max(slice_max, row, slices, BLOCK_S: tl.constexpr):
    offs = tl.arange(0, BLOCK_S)
    return tl.max(tl.load(slice_max + row * slices + offs, mask=offs < slices, other=float("-inf")), 0)


@triton.jit
def _min_p_key(best, least):
    """The order key of min-p's cut-off: best + log(min_p) (under every key where min_p `least` is 0)."""
    return tl.where(least > 0.0, order_key(best + tl.log(tl.maximum(least, 1e-30))).to(tl.int64), _KEY_MIN)


@triton.jit
def _kept_mass_kernel(x, inverse, min_p, slice_max, slice_sum, slice_kept, vocab, stride_x, slices,
                      SLICE: tl.constexpr, BLOCK_S: tl.constexpr):
    """Program (row, slice), after pass 0: the slice's mass (relative to its own max) of the tokens min-p keeps,
    the whole slice's where the row has min-p off (its slice is then not read)."""
    row, part = tl.program_id(0).to(tl.int64), tl.program_id(1)
    least = tl.load(min_p + row)
    at = row * slices + part
    if least > 0.0:
        v = _scaled_block(x, tl.load(inverse + row), row, stride_x, part * SLICE, vocab, SLICE)
        cut = _min_p_key(_row_max(slice_max, row, slices, BLOCK_S), least)
        weight = tl.where((v > float("-inf")) & (order_key(v).to(tl.int64) >= cut),
                          tl.exp(v - tl.load(slice_max + at)), 0.0)
        tl.store(slice_kept + at, tl.sum(weight, 0))
    else:
        tl.store(slice_kept + at, tl.load(slice_sum + at))


@triton.jit
def _interval_low(lows, mass, top_p, scales, total, row, rows, slices, PASS: tl.constexpr, BLOCK_S: tl.constexpr,
                  PIVOTS: tl.constexpr):
    """The low end of the interval of keys pass PASS (> 0) searches, from pass PASS - 1's. Pivot 0 is that
    pass's low end, where the mass above is at least top_p; pivots 1.. at or above it too are all the first
    ones (the mass above shrinks as the key grows), so the interval moves up by their count of steps."""
    offs_s, offs_p = tl.arange(0, BLOCK_S), tl.arange(0, PIVOTS)
    at = mass + ((PASS - 1) * rows + row) * slices * PIVOTS + offs_s[:, None] * PIVOTS + offs_p[None, :]
    above = tl.sum(tl.load(at, mask=(offs_s < slices)[:, None], other=0.0) * scales[:, None], 0)
    crossed = (above >= tl.load(top_p + row) * total) & (offs_p > 0)
    step = 1 << (32 - 4 * PASS)  # the previous pass's, as a Python int
    return tl.load(lows + (PASS - 1) * rows + row) + tl.sum(crossed.to(tl.int64), 0) * step


@triton.jit
def _pivot_mass_kernel(x, inverse, top_p, slice_max, slice_sum, slice_kept, lows, mass, vocab, stride_x, slices,
                       PASS: tl.constexpr, SLICE: tl.constexpr, BLOCK_S: tl.constexpr, PIVOTS: tl.constexpr):
    """Program (row, slice) of pass PASS: its slice's mass (exp(logit - the slice's max)) above each of the
    pass's pivots; the row's first program also records the pass's low end, where the mass above crosses
    top_p of what min-p keeps (slice_kept). Pass 0 also records the slice's max and total mass. The slice is loaded whole: a walk of it by 512-token blocks took about as long. The
    row count is the grid's, not an argument, so that no count of rows compiles a kernel of its own."""
    row, part, rows = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.num_programs(0)
    v = _scaled_block(x, tl.load(inverse + row), row, stride_x, part * SLICE, vocab, SLICE)
    if PASS == 0:
        ref = tl.max(v, 0)
        low = tl.full([], _KEY_MIN, tl.int64)
    else:
        ref = tl.load(slice_max + row * slices + part)
        _, total, scales = _row_sums(slice_max, slice_kept, row, slices, BLOCK_S)
        low = _interval_low(lows, mass, top_p, scales, total, row, rows, slices, PASS, BLOCK_S, PIVOTS)
    if part == 0:
        tl.store(lows + PASS * rows + row, low)
    # Every pivot is a key (int32): the last of pass 0 is KEY_MIN + 15 * 2^28, and each later pass's
    # interval lies inside one step of the one before.
    offs_p = tl.arange(0, PIVOTS)
    pivots = (low + offs_p.to(tl.int64) * (1 << (28 - 4 * PASS))).to(tl.int32)
    first, last = tl.min(pivots, 0), tl.max(pivots, 0)
    weight = tl.where(v > float("-inf"), tl.exp(v - ref), 0.0)
    key = order_key(v)
    above = tl.zeros([PIVOTS], tl.float32) + tl.sum(tl.where(key > last, weight, 0.0), 0)  # above every pivot
    between = (key > first) & (key <= last)
    if tl.max(between.to(tl.int32), 0) > 0:  # once the interval is narrow most slices hold no key inside it
        # Selected once, so that each pivot's sum compares one key: 2249 -> 1547 us at 128 rows on the H200
        # (sampling_masks_5373a45_again.json, sampling_masks_38cb2fd.json).
        inside = tl.where(between, weight, 0.0)
        for i in tl.static_range(PIVOTS):
            pivot = tl.sum(tl.where(offs_p == i, pivots, 0), 0)
            above += tl.where(offs_p == i, tl.sum(tl.where(key > pivot, inside, 0.0), 0), 0.0)
    tl.store(mass + ((PASS * rows + row) * slices + part) * PIVOTS + offs_p, above)
    if PASS == 0:
        tl.store(slice_max + row * slices + part, ref)
        tl.store(slice_sum + row * slices + part, tl.sum(weight, 0))


@triton.jit
def _floor_of(low, share, least, best):
    """The larger of the top-p floor (one past the last pass's low end, whose step is 1; none where top_p
    `share` is 1) and the min-p floor (the key of best + log(min_p); none where min_p `least` is 0)."""
    floor = tl.where(share < 1.0, low + 1, _KEY_MIN)
    return tl.maximum(floor, _min_p_key(best, least)).to(tl.int32)


@triton.jit
def _floor_kernel(top_p, min_p, slice_max, slice_kept, lows, mass, floors, slices, PASSES: tl.constexpr,
                  BLOCK_S: tl.constexpr, PIVOTS: tl.constexpr):
    """Program per row: its floor."""
    row, rows = tl.program_id(0).to(tl.int64), tl.num_programs(0)
    best, total, scales = _row_sums(slice_max, slice_kept, row, slices, BLOCK_S)
    low = _interval_low(lows, mass, top_p, scales, total, row, rows, slices, PASSES, BLOCK_S, PIVOTS)
    tl.store(floors + row, _floor_of(low, tl.load(top_p + row), tl.load(min_p + row), best))


def nucleus_floors(x: torch.Tensor, inverse: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                   slice_: int = SLICE, num_warps: int = NUM_WARPS, with_min_p: bool = True) -> torch.Tensor:
    """floors [B] (int32): row b keeps the tokens whose scaled logit x[b] * inverse[b] has an order key
    (reference.order_keys) at or above floors[b], what top_p[b] (1 = off) and min_p[b] (0 = off) keep.
    x [B, V] float32 (last dim contiguous); inverse, top_p, min_p [B] float32. slice_ (a power of two) and
    num_warps tune the pivot passes. with_min_p False (the host knows no row has min-p on) skips the pass that
    sums what min-p keeps: top-p's share is then of each slice's whole mass."""
    rows, vocab = x.shape
    floors = torch.empty(rows, dtype=torch.int32, device=x.device)
    if rows == 0:
        return floors
    assert x.stride(-1) == 1 and x.dtype == torch.float32
    slices = triton.cdiv(vocab, slice_)
    block_s = triton.next_power_of_2(slices)
    slice_max = torch.empty(rows, slices, dtype=torch.float32, device=x.device)
    slice_sum = torch.empty_like(slice_max)
    slice_kept = torch.empty_like(slice_max) if with_min_p else slice_sum
    lows = torch.empty(PASSES, rows, dtype=torch.int64, device=x.device)
    mass = torch.empty(PASSES, rows, slices, PIVOTS, dtype=torch.float32, device=x.device)
    for pass_ in range(PASSES):
        _pivot_mass_kernel[(rows, slices)](x, inverse, top_p, slice_max, slice_sum, slice_kept, lows, mass, vocab,
                                           x.stride(0), slices, PASS=pass_, SLICE=slice_, BLOCK_S=block_s,
                                           PIVOTS=PIVOTS, num_warps=num_warps)
        if pass_ == 0 and with_min_p:  # the row's max is known from here: what min-p keeps, for the passes after
            _kept_mass_kernel[(rows, slices)](x, inverse, min_p, slice_max, slice_sum, slice_kept, vocab,
                                              x.stride(0), slices, SLICE=slice_, BLOCK_S=block_s,
                                              num_warps=num_warps)
    _floor_kernel[(rows,)](top_p, min_p, slice_max, slice_kept, lows, mass, floors, slices, PASSES=PASSES,
                           BLOCK_S=block_s, PIVOTS=PIVOTS, num_warps=1)
    return floors
