"""torch.topk of a few tokens of long rows, from a short list of each row's candidates.

The sampler's top-k 20 over rows of the 9B shape's 248320 tokens, built on torch.topk of the rows, took
0.78-1.21 ms a call at 32 rows as at 128 on the H200 (sampling_masks_fbd6851.json, `topk`), where one read
of 128 rows is 30 us at the bandwidth. Here three reads of a row narrow it to at most k * BLOCK
candidates, and torch.topk runs over those:

1. each block of BLOCK tokens takes its max; the k-th largest block max of a row is its threshold t. The
   k blocks of the largest maxima hold k tokens at or above t, so the row's best k tokens are all at or
   above t; fewer than k blocks have a max above t, so at most (k - 1) * BLOCK tokens lie above t.
2. each (row, slice) program counts its tokens above t and equal to t;
3. each places them in the row's candidate list from those counts' running sums: the tokens above t
   first, then the tokens equal to t as far as the list's k * BLOCK places go, which leaves at least k of
   them where there are. Places follow the tokens' order, so the list is the same on every run.
"""

import torch
import triton
import triton.language as tl

BLOCK = 128  # tokens a block max covers: a list of 2560 candidates for top-k 20
SLICE = 8192  # tokens a program of passes 1 to 3 reads
MAX_LIST = 32768  # a longer candidate list (top-k above 256) is not worth it: torch.topk of the row instead


@triton.jit
def _slice(x, row, stride_x, part, vocab, SLICE: tl.constexpr):
    cols = part * SLICE + tl.arange(0, SLICE)
    return tl.load(x + row * stride_x + cols, mask=cols < vocab, other=float("-inf")), cols


@triton.jit
def _block_max_kernel(x, block_max, vocab, stride_x, blocks, SLICE: tl.constexpr, BLOCK: tl.constexpr):
    row, part = tl.program_id(0).to(tl.int64), tl.program_id(1)
    v, _ = _slice(x, row, stride_x, part, vocab, SLICE)
    maxes = tl.max(tl.reshape(v, [SLICE // BLOCK, BLOCK]), 1)
    index = part * (SLICE // BLOCK) + tl.arange(0, SLICE // BLOCK)
    tl.store(block_max + row * blocks + index, maxes, mask=index < blocks)


@triton.jit
def _count_kernel(x, threshold, counts, vocab, stride_x, SLICE: tl.constexpr):
    """counts[row, part] = (tokens above the row's threshold, tokens equal to it) in the slice."""
    row, part, slices = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.num_programs(1)
    v, cols = _slice(x, row, stride_x, part, vocab, SLICE)
    t = tl.load(threshold + row)
    at = counts + (row * slices + part) * 2
    tl.store(at, tl.sum((v > t).to(tl.int32), 0))
    tl.store(at + 1, tl.sum(((v == t) & (cols < vocab)).to(tl.int32), 0))


@triton.jit
def _place_kernel(x, threshold, starts, above_total, values, indices, vocab, stride_x, length,
                  SLICE: tl.constexpr):
    """Writes the slice's tokens above the threshold, then those equal to it, at their places in the row's
    list of `length`: starts[row, part] holds the exclusive running sums of the counts."""
    row, part, slices = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.num_programs(1)
    v, cols = _slice(x, row, stride_x, part, vocab, SLICE)
    t = tl.load(threshold + row)
    above, equal = v > t, (v == t) & (cols < vocab)
    at = starts + (row * slices + part) * 2
    place_above = tl.load(at) + tl.cumsum(above.to(tl.int32), 0) - 1
    place_equal = tl.load(above_total + row) + tl.load(at + 1) + tl.cumsum(equal.to(tl.int32), 0) - 1
    place = tl.where(above, place_above, place_equal)
    keep = (above | equal) & (place < length)
    tl.store(values + row * length + place, v, mask=keep)
    tl.store(indices + row * length + place, cols.to(tl.int64), mask=keep)


def list_length(k: int) -> int:
    return k * BLOCK


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x, k, dim=-1): (values, indices) [B, k], each row's in descending order, for x [B, V]
    float32 with unit stride along V. As torch.topk's, which of the tokens tied at the k-th value are kept
    is not specified."""
    rows, vocab = x.shape
    blocks = triton.cdiv(vocab, BLOCK)
    length = list_length(k)
    if k > blocks or length > min(MAX_LIST, vocab // 4) or rows == 0:
        return x.topk(k, dim=-1)
    assert x.dtype == torch.float32 and x.stride(1) == 1
    slices = triton.cdiv(vocab, SLICE)
    block_max = torch.empty(rows, blocks, dtype=torch.float32, device=x.device)
    _block_max_kernel[(rows, slices)](x, block_max, vocab, x.stride(0), blocks, SLICE=SLICE, BLOCK=BLOCK,
                                      num_warps=8)
    threshold = block_max.topk(k, dim=-1, sorted=False).values.amin(-1)
    counts = torch.empty(rows, slices, 2, dtype=torch.int32, device=x.device)
    _count_kernel[(rows, slices)](x, threshold, counts, vocab, x.stride(0), SLICE=SLICE, num_warps=8)
    starts = (counts.cumsum(1, dtype=torch.int32) - counts).contiguous()
    above_total = counts[:, :, 0].sum(1, dtype=torch.int32)
    values = torch.full((rows, length), float("-inf"), dtype=torch.float32, device=x.device)
    indices = torch.zeros(rows, length, dtype=torch.int64, device=x.device)
    _place_kernel[(rows, slices)](x, threshold, starts, above_total, values, indices, vocab, x.stride(0), length,
                                  SLICE=SLICE, num_warps=8)
    best, order = values.topk(k, dim=-1)
    return best, indices.gather(1, order)
