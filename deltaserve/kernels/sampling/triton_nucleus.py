"""Top-p and min-p for rows without top-k, as a floor per row on the order of its scaled logits, found
without sorting the vocabulary; the race kernel (triton_race.py) drops what lies below it as it reads the row.

A row keeps the tokens whose order key (order_key: the float's bits as an int32 that orders as the floats
do, reference.order_keys) is at least its floor. Top-p's floor is the least key c at which the probability
mass strictly above c is under top_p: reference.mask_logits keeps those tokens, except that tokens of equal
value are kept or dropped together here. It is found in PASSES passes over the row, each trying PIVOTS keys
spread evenly over the interval that still holds it and keeping the sixteenth where the mass crosses top_p,
four bits of the key a pass. A pass is a grid of (row, slice) programs, each summing its slice's mass above
every pivot; the next pass's programs read those sums to place their interval, so a pass is one launch.
Min-p's floor is the key of max + log(min_p): a token's probability over the best one's is exp(x - max).
Ten reads of a row (two for its max and its sum, the second from the caches) replace the sort of the vocabulary."""

import torch
import triton
import triton.language as tl

BLOCK = 1024
SLICE_BLOCKS = 8  # blocks a program walks: rows of the 9B shape's 248320 tokens take 31 slices
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
def _slice_max_sum_kernel(x, inverse, slice_max, slice_sum, vocab, stride_x, slices,
                          BLOCK: tl.constexpr, SLICE_BLOCKS: tl.constexpr):
    """Program (row, slice): the slice's largest scaled logit and the sum of exp(logit - it)."""
    row, part = tl.program_id(0).to(tl.int64), tl.program_id(1)
    scale = tl.load(inverse + row)
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    for b in range(SLICE_BLOCKS):
        top = tl.maximum(top, _scaled_block(x, scale, row, stride_x, (part * SLICE_BLOCKS + b) * BLOCK, vocab, BLOCK))
    best = tl.max(top, 0)
    total = tl.zeros([BLOCK], tl.float32)
    for b in range(SLICE_BLOCKS):  # the slice again, from L1 and L2
        v = _scaled_block(x, scale, row, stride_x, (part * SLICE_BLOCKS + b) * BLOCK, vocab, BLOCK)
        total += tl.where(v > float("-inf"), tl.exp(v - best), 0.0)
    tl.store(slice_max + row * slices + part, best)
    tl.store(slice_sum + row * slices + part, tl.sum(total, 0))


@triton.jit
def _row_max_sum(slice_max, slice_sum, row, slices, BLOCK_S: tl.constexpr):
    """(max, sum of exp(logit - max)) of a row's scaled logits, from its slices'."""
    offs = tl.arange(0, BLOCK_S)
    live = offs < slices
    maxes = tl.load(slice_max + row * slices + offs, mask=live, other=float("-inf"))
    sums = tl.load(slice_sum + row * slices + offs, mask=live, other=0.0)
    best = tl.max(maxes, 0)
    return best, tl.sum(tl.where(maxes > float("-inf"), sums * tl.exp(maxes - best), 0.0), 0)


@triton.jit
def _interval_low(lows, mass, top_p, total, row, rows, slices, PASS: tl.constexpr, BLOCK_S: tl.constexpr,
                  PIVOTS: tl.constexpr):
    """The low end of the interval of keys pass PASS searches, from pass PASS - 1's. Pivot 0 is that pass's
    low end, where the mass above is at least top_p; pivots 1.. at or above it too are all the first ones
    (the mass above shrinks as the key grows), so the interval moves up by their count of steps."""
    if PASS == 0:
        low = tl.full([], _KEY_MIN, tl.int64)
    else:
        offs_s, offs_p = tl.arange(0, BLOCK_S), tl.arange(0, PIVOTS)
        at = mass + ((PASS - 1) * rows + row) * slices * PIVOTS + offs_s[:, None] * PIVOTS + offs_p[None, :]
        above = tl.sum(tl.load(at, mask=(offs_s < slices)[:, None], other=0.0), 0)
        crossed = (above >= tl.load(top_p + row) * total) & (offs_p > 0)
        step = 1 << (32 - 4 * PASS)  # the previous pass's, as a Python int
        low = tl.load(lows + (PASS - 1) * rows + row) + tl.sum(crossed.to(tl.int64), 0) * step
    return low


@triton.jit
def _pivot_mass_kernel(x, inverse, top_p, slice_max, slice_sum, lows, mass, vocab, stride_x, slices,
                       PASS: tl.constexpr, BLOCK: tl.constexpr, SLICE_BLOCKS: tl.constexpr, BLOCK_S: tl.constexpr,
                       PIVOTS: tl.constexpr):
    """Program (row, slice) of pass PASS: its slice's mass (exp(logit - max)) above each of the pass's
    pivots; the row's first program also records the pass's low end. The row count is the grid's, not an
    argument, so that no count of rows compiles a kernel of its own."""
    row, part, rows = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.num_programs(0)
    best, total = _row_max_sum(slice_max, slice_sum, row, slices, BLOCK_S)
    low = _interval_low(lows, mass, top_p, total, row, rows, slices, PASS, BLOCK_S, PIVOTS)
    if part == 0:
        tl.store(lows + PASS * rows + row, low)
    pivots = low + tl.arange(0, PIVOTS).to(tl.int64) * (1 << (28 - 4 * PASS))
    scale = tl.load(inverse + row)
    above = tl.zeros([PIVOTS], tl.float32)
    for b in range(SLICE_BLOCKS):
        v = _scaled_block(x, scale, row, stride_x, (part * SLICE_BLOCKS + b) * BLOCK, vocab, BLOCK)
        weight = tl.where(v > float("-inf"), tl.exp(v - best), 0.0)
        over = order_key(v).to(tl.int64)[:, None] > pivots[None, :]
        above += tl.sum(tl.where(over, weight[:, None], 0.0), 0)
    tl.store(mass + ((PASS * rows + row) * slices + part) * PIVOTS + tl.arange(0, PIVOTS), above)


@triton.jit
def _floor_kernel(top_p, min_p, slice_max, slice_sum, lows, mass, floors, slices, PASSES: tl.constexpr,
                  BLOCK_S: tl.constexpr, PIVOTS: tl.constexpr):
    """Program per row: the larger of its top-p floor (one past the last pass's low end, whose step is 1)
    and its min-p floor."""
    row, rows = tl.program_id(0).to(tl.int64), tl.num_programs(0)
    best, total = _row_max_sum(slice_max, slice_sum, row, slices, BLOCK_S)
    floor = _interval_low(lows, mass, top_p, total, row, rows, slices, PASSES, BLOCK_S, PIVOTS) + 1
    floor = tl.where(tl.load(top_p + row) < 1.0, floor, _KEY_MIN)
    least = tl.load(min_p + row)
    by_min_p = order_key(best + tl.log(tl.maximum(least, 1e-30))).to(tl.int64)
    floor = tl.where(least > 0.0, tl.maximum(floor, by_min_p), floor)
    tl.store(floors + row, floor.to(tl.int32))


def nucleus_floors(x: torch.Tensor, inverse: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """floors [B] (int32): row b keeps the tokens whose scaled logit x[b] * inverse[b] has an order key
    (reference.order_keys) at or above floors[b], what top_p[b] (1 = off) and min_p[b] (0 = off) keep.
    x [B, V] float32 (last dim contiguous); inverse, top_p, min_p [B] float32."""
    rows, vocab = x.shape
    floors = torch.empty(rows, dtype=torch.int32, device=x.device)
    if rows == 0:
        return floors
    assert x.stride(-1) == 1 and x.dtype == torch.float32
    slices = triton.cdiv(vocab, BLOCK * SLICE_BLOCKS)
    block_s = triton.next_power_of_2(slices)
    slice_max = torch.empty(rows, slices, dtype=torch.float32, device=x.device)
    slice_sum = torch.empty_like(slice_max)
    lows = torch.empty(PASSES, rows, dtype=torch.int64, device=x.device)
    mass = torch.empty(PASSES, rows, slices, PIVOTS, dtype=torch.float32, device=x.device)
    _slice_max_sum_kernel[(rows, slices)](x, inverse, slice_max, slice_sum, vocab, x.stride(0), slices,
                                          BLOCK=BLOCK, SLICE_BLOCKS=SLICE_BLOCKS, num_warps=4)
    for pass_ in range(PASSES):
        _pivot_mass_kernel[(rows, slices)](x, inverse, top_p, slice_max, slice_sum, lows, mass, vocab, x.stride(0),
                                           slices, PASS=pass_, BLOCK=BLOCK, SLICE_BLOCKS=SLICE_BLOCKS,
                                           BLOCK_S=block_s, PIVOTS=PIVOTS, num_warps=8)
    _floor_kernel[(rows,)](top_p, min_p, slice_max, slice_sum, lows, mass, floors, slices, PASSES=PASSES,
                           BLOCK_S=block_s, PIVOTS=PIVOTS, num_warps=1)
    return floors
