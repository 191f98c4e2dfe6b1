"""The experts' SwiGLU MLPs as two grouped GEMMs over (token, choice) pairs sorted by expert; batches of
a few tokens take the unsorted path of `triton_moe_direct.py` instead (see `moe_experts`).

Pairs are sorted by expert on the device by a stable counting sort (`align_pairs`: one launch for a
short pass, three for a long one), which also lays each expert's run of pairs out as blocks of BLOCK_M
rows (`block_start[e]`: the first block of expert e; nothing is read back to the host, so a decode
step can be graph-captured). One program per (block, tile of output columns): only touched experts
get programs, and at decode sizes (an expert's pairs fit in one block) each touched expert's weights
are read once per step. The grid's fast axis decides what the programs running together share
through L2: the blocks of one expert (its weight tile) or the column tiles of one block (its gathered
input rows).
  1. gate/up: inter[pair] = silu(x[token] @ W_gate^T) * (x[token] @ W_up^T), both halves in one program.
  2. down:    y[token, choice] = weight * (inter[pair] @ W_down^T), written to the pair's own row.
The k rows of each token are then summed in fp32 in a fixed order: no atomics, so results are exact
across runs (a prefix-cache hit must reproduce a miss bit for bit).
A pair with an id past the experts (a graph's padding row, see moe_route's live_rows) is unrouted: it
sorts after every expert's run, gets no block, and the sum leaves it out.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from deltaserve.kernels.moe.triton_moe_direct import moe_experts_direct
from deltaserve.kernels.partial_sums import PartialSums

# Up to this many (token, choice) pairs the unsorted path runs. Each pair streams its expert's weights
# through the SMs (from L2 when another pair read them just before), so the limit counts pairs: 32
# tokens at top-8. With the shared expert stacked as one more choice it is 28 tokens (graph rungs up
# to 24): the shared expert adds a pair per token to the direct path but only an expert's blocks to the
# sorted one. At top-8 alone the paths crossed between 16 and 32 tokens on the H200 (kernels_check
# moe_T16: direct 172 us, sorted 175; moe_T32: 311 against 291).
DIRECT_MAX_PAIRS = 256


@triton.jit
def _block_rows(block, offsets, block_start, EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr):
    """(expert, first pair, end pair) of block `block`; end <= first for blocks past the last."""
    lanes = tl.arange(0, BLOCK_E)
    ends = tl.load(block_start + 1 + lanes, mask=lanes < EXPERTS, other=2147483647)
    expert = tl.minimum(tl.sum((ends <= block).to(tl.int32), 0), EXPERTS - 1)
    lo = tl.load(offsets + expert) + (block - tl.load(block_start + expert)) * BLOCK_M
    hi = tl.minimum(tl.load(offsets + expert + 1), lo + BLOCK_M)
    return expert, lo, hi


@triton.jit
def _block_and_column_tile(COLUMNS_FAST: tl.constexpr):
    """This program's (row block, column tile) in the grid order `_grid` launched."""
    if COLUMNS_FAST:  # the programs of one block of rows run together: its gathered rows are read once
        return tl.program_id(1), tl.program_id(0)
    return tl.program_id(0), tl.program_id(1)  # the blocks of one expert run together: its weight tile is read once


@triton.jit
def _moe_gate_up_kernel(
    x, w13, w13_desc, order, offsets, block_start, inter, stride_x, stride_we, stride_wn, stride_inter,
    EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    COLUMNS_FAST: tl.constexpr, TMA: tl.constexpr,
):
    """TMA: the weight tiles come through w13_desc, a descriptor of w13 as [E * 2I, H] in [BLOCK_N, BLOCK_K]
    boxes (BLOCK_N divides I, so a box never crosses from the gate rows into the up rows)."""
    block, ntile = _block_and_column_tile(COLUMNS_FAST)
    expert, lo, hi = _block_rows(block, offsets, block_start, EXPERTS, BLOCK_E, BLOCK_M)
    if lo < hi:
        offs_n = ntile * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < INTER
        w_base = w13 + expert.to(tl.int64) * stride_we
        pairs = lo + tl.arange(0, BLOCK_M)
        mask_m = pairs < hi
        tokens = (tl.load(order + pairs, mask=mask_m, other=0) // TOP_K).to(tl.int64)
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < HIDDEN
            a = tl.load(x + tokens[:, None] * stride_x + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                        other=0.0)
            if TMA:
                row = expert * (2 * INTER) + ntile * BLOCK_N
                w_gate = w13_desc.load([row, k0])
                w_up = w13_desc.load([row + INTER, k0])
            else:
                w_mask = mask_n[:, None] & mask_k[None, :]
                w_gate = tl.load(w_base + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
                w_up = tl.load(w_base + (INTER + offs_n)[:, None] * stride_wn + offs_k[None, :], mask=w_mask,
                               other=0.0)
            acc_gate = tl.dot(a, tl.trans(w_gate), acc_gate, input_precision=PRECISION)
            acc_up = tl.dot(a, tl.trans(w_up), acc_up, input_precision=PRECISION)
        h = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
        tl.store(inter + pairs.to(tl.int64)[:, None] * stride_inter + offs_n[None, :], h.to(inter.dtype.element_ty),
                 mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _moe_down_kernel(
    inter, inter_desc, w2, w2_desc, weights, order, offsets, block_start, y, stride_inter, stride_we, stride_wn,
    stride_y, EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    COLUMNS_FAST: tl.constexpr, TMA: tl.constexpr,
):
    """TMA: the tiles come through descriptors, of inter in [BLOCK_M, BLOCK_K] boxes (a block's pairs are
    consecutive rows; the rows past its last belong to the next expert or lie past the end, where the box
    reads zeros, and are not stored) and of w2 as [E * H, I] in [BLOCK_N, BLOCK_K] boxes (BLOCK_N divides H)."""
    block, ntile = _block_and_column_tile(COLUMNS_FAST)
    expert, lo, hi = _block_rows(block, offsets, block_start, EXPERTS, BLOCK_E, BLOCK_M)
    if lo < hi:
        offs_n = ntile * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < HIDDEN
        w_base = w2 + expert.to(tl.int64) * stride_we
        pairs = lo + tl.arange(0, BLOCK_M)
        mask_m = pairs < hi
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < INTER
            if TMA:
                a = inter_desc.load([lo, k0])
                w = w2_desc.load([expert * HIDDEN + ntile * BLOCK_N, k0])
            else:
                a = tl.load(inter + pairs.to(tl.int64)[:, None] * stride_inter + offs_k[None, :],
                            mask=mask_m[:, None] & mask_k[None, :], other=0.0)
                w = tl.load(w_base + offs_n[:, None] * stride_wn + offs_k[None, :],
                            mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
        dest = tl.load(order + pairs, mask=mask_m, other=0).to(tl.int64)  # token * k + choice
        weight = tl.load(weights + dest, mask=mask_m, other=0.0).to(tl.float32)
        tl.store(y + dest[:, None] * stride_y + offs_n[None, :], (acc * weight[:, None]).to(y.dtype.element_ty),
                 mask=mask_m[:, None] & mask_n[None, :])


class SortedTiles(NamedTuple):
    gate_n: int  # gate/up kernel: intermediate columns per program
    gate_k: int  # hidden columns per step
    down_n: int  # down kernel: output columns per program
    down_k: int  # intermediate columns per step
    block_m: int  # pairs per block (one expert's run is cut into blocks of this many)
    warps: int
    stages: int
    columns_fast: bool = False  # grid order: column tiles (not row blocks) on the fast axis
    down_warps: int = 0  # the down kernel's warps and stages where they differ (0: the gate/up kernel's)
    down_stages: int = 0
    tma: bool = False  # the weight tiles (and the down kernel's input rows) through TMA descriptors


# From the H200 sweeps of benchmarks/kernels_check.py: moe_sorted_tiles_T* for the small tiles,
# moe_sorted_large_tiles_T* for the others (8 choices over 256 experts). With the column tiles on the
# grid's fast axis the medium tiles took 631 us at 2048 tokens (684 with the blocks fast) and the
# large ones 1.31 ms at 8192 tokens (1.51 ms for the best tiles with the blocks fast); at 64 tokens
# every order and tile measured about the same (377-390 us for the 64-row blocks). The large tiles load
# four steps ahead: at 8192 tokens (9 choices over 257 experts) the gate/up kernel took 672-675 us
# against 685-686 with three, the down kernel 444-447 against 455-457 (twice each); at 32768 tokens no
# different beyond the spread of repeated runs. Through TMA descriptors the large tiles took 3775 us
# against 4145 at 32768 tokens (gate/up 2005 against 2507, down 1466 against 1665) and 1127 against 1211 at
# 8192, the same output (kernels_check_moe_tma.json, moe_sorted_tma_T*).
SMALL_TILES = SortedTiles(32, 128, 64, 128, 16, 4, 3)  # a few pairs per expert
MEDIUM_TILES = SortedTiles(64, 64, 64, 64, 64, 4, 3, True)
LARGE_TILES = SortedTiles(128, 64, 256, 64, 128, 8, 4, True, tma=True)
LARGE_MIN_PAIRS_PER_EXPERT = 128


# Up to this many pairs per expert the small tiles' 16-pair blocks win: at 80 tokens (2.5 pairs per
# expert, a prefix-cache hit's tail) they took 357 us on the H200 against 369 for the medium tiles
# (kernels_check moe_sorted_tail_tiles_T80), at 144 (4.5 per expert, the pairs of a 128-sequence decode
# step) 393 against 413 (moe_sorted_tail_tiles_T144, kernels_check_moe_tail_T144.json).
SMALL_MAX_PAIRS_PER_EXPERT = 5


def default_tiles(pairs: int, experts: int) -> SortedTiles:
    if pairs <= SMALL_MAX_PAIRS_PER_EXPERT * experts:  # a few pairs per expert
        return SMALL_TILES
    return LARGE_TILES if pairs >= LARGE_MIN_PAIRS_PER_EXPERT * experts else MEDIUM_TILES


def _grid(blocks: int, column_tiles: int, columns_fast: bool) -> tuple[int, int]:
    return (column_tiles, blocks) if columns_fast else (blocks, column_tiles)


# Up to this many pairs a counting sort in Triton orders them and lays out the experts' blocks in one
# launch: each program takes the histogram of every pair's expert (where each expert's run starts) and
# of the pairs before its own (where its pairs go in their runs). For 864 pairs over 257 experts it took
# 7.1 us on the H200 against 38.4 for torch's radix sort and the binary-search align kernel behind it
# (benchmarks/results/kernels_check_moe_align.json): a millisecond over the 40 layers of a short prefill
# pass. Larger batches take the block-wise sort below. With 32 pairs ranked per program, the 720 pairs
# of an 80-row graph pass took 6.1 us against 7.3 at 64 and 9.2 at 128; one program sorting every pair
# in registers (tl.sort) took 8.2 (H200, kernels_check_short_pass_tiles.json, moe_align_T80).
COUNTING_SORT_MAX_PAIRS = 4096
RANK_BLOCK = 32
COMBINE_BLOCK = 1024


@triton.jit
def _count_and_rank_kernel(ids, order, offsets, block_start, num_pairs, EXPERTS: tl.constexpr,
                           BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, ALL: tl.constexpr, BLOCK: tl.constexpr):
    """A stable counting sort of this program's BLOCK pairs: pair i goes to rank(i) = (pairs of a smaller
    expert) + (pairs of its expert before i); order[rank(i)] = i. Program 0 also writes offsets[e] (first
    sorted pair of expert e) and block_start[e] (its first block), [E + 1]."""
    # A bin past every expert and past the unrouted id (EXPERTS), for the lanes that hold no pair.
    TRASH: tl.constexpr = BLOCK_E - 1
    first_i = tl.program_id(0) * BLOCK
    j = tl.arange(0, ALL)
    id_j = tl.load(ids + j, mask=j < num_pairs, other=TRASH).to(tl.int32)
    lanes = tl.arange(0, BLOCK_E)
    counts = tl.where(lanes < EXPERTS, tl.histogram(id_j, BLOCK_E), 0)
    run_start = tl.cumsum(counts, 0) - counts
    earlier = tl.histogram(tl.where(j < first_i, id_j, TRASH), BLOCK_E)  # pairs of earlier programs
    if tl.program_id(0) == 0:
        blocks = (counts + BLOCK_M - 1) // BLOCK_M
        tl.store(offsets + lanes, run_start, mask=lanes <= EXPERTS)
        tl.store(block_start + lanes, tl.cumsum(blocks, 0) - blocks, mask=lanes <= EXPERTS)

    i = first_i + tl.arange(0, BLOCK)
    valid_i = i < num_pairs
    id_i = tl.load(ids + i, mask=valid_i, other=TRASH).to(tl.int32)
    before_block = tl.sum(tl.where(id_i[:, None] == lanes[None, :], (run_start + earlier)[None, :], 0), 1)
    same_before = (id_i[None, :] == id_i[:, None]) & (i[None, :] < i[:, None])  # in this block
    rank = before_block + tl.sum(same_before.to(tl.int32), 1)
    tl.store(order + rank, i.to(tl.int64), mask=valid_i)


@triton.jit
def _combine_kernel(y, ids, out, stride_y, stride_out, TOP_K: tl.constexpr, HIDDEN: tl.constexpr,
                    EXPERTS: tl.constexpr, BLOCK: tl.constexpr):
    """out[token] = the sum of its routed pairs' rows of y, in fp32, in choice order (unrouted pairs
    were never computed: their rows of y hold nothing)."""
    token, tile = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for choice in tl.static_range(TOP_K):
        pair = token * TOP_K + choice
        routed = tl.load(ids + pair) < EXPERTS
        acc += tl.load(y + pair * stride_y + offs, mask=mask & routed, other=0.0).to(tl.float32)
    tl.store(out + token * stride_out + offs, acc.to(out.dtype.element_ty), mask=mask)


def _count_and_rank(flat_ids: torch.Tensor, num_experts: int, block_m: int, rank_block: int = RANK_BLOCK,
                    num_warps: int = 4):
    """(order, offsets, block_start) by the counting sort (see COUNTING_SORT_MAX_PAIRS)."""
    pairs, device = flat_ids.shape[0], flat_ids.device
    order = torch.empty(pairs, dtype=torch.int64, device=device)
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    block_start = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    _count_and_rank_kernel[(triton.cdiv(pairs, rank_block),)](
        flat_ids, order, offsets, block_start, pairs, EXPERTS=num_experts,
        BLOCK_E=triton.next_power_of_2(num_experts + 2), BLOCK_M=block_m, ALL=triton.next_power_of_2(pairs),
        BLOCK=rank_block, num_warps=num_warps)
    return order, offsets, block_start


# Past COUNTING_SORT_MAX_PAIRS every program taking every pair's histogram would cost O(pairs) a program,
# so the pairs are sorted by blocks of SORT_BLOCK, in three launches linear in the pairs with nothing
# read back: each block takes its histogram; a scan over the blocks gives each (block, expert) the pairs
# of that expert in earlier blocks; each block then ranks its pairs RANK_TILE at a time, carrying each
# expert's next rank from tile to tile. An 8192-token prompt's 73728 pairs are 288 blocks: 22.7 us on the
# H200, where torch's stable sort alone took 66.7 and the align kernel after it about 21; blocks of 512
# or 1024 pairs took 26.9 and 34.9 (benchmarks/results/kernels_check_moe_block_sort.json, moe_align_T8192).
SORT_BLOCK = 256
RANK_TILE = 64  # a [64, 64] compare in a tile: 80 registers at 4 warps on sm_90 (a [128, 128] one: 210)
SCAN_EXPERTS = 32  # bins per scan program: 16 programs for 257 experts' 512 bins
SCAN_ROWS = 128  # blocks per scan step


@triton.jit
def _block_histogram_kernel(ids, counts, num_pairs, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr):
    """counts[b, e] = the pairs of expert e among block b's BLOCK pairs (bin EXPERTS: the unrouted ones)."""
    # Lanes past the last pair go to the last bin, past every expert and the unrouted id.
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    id_i = tl.load(ids + i, mask=i < num_pairs, other=BLOCK_E - 1).to(tl.int32)
    tl.store(counts + tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E), tl.histogram(id_i, BLOCK_E))


@triton.jit
def _block_scan_kernel(counts, num_blocks, BLOCK_E: tl.constexpr, TILE_E: tl.constexpr, ROWS: tl.constexpr):
    """In place, counts[b, e] becomes the pairs of expert e in the blocks before b, for b <= num_blocks:
    row num_blocks gets each expert's total. A program per TILE_E bins walks the blocks ROWS at a time."""
    bins = tl.program_id(0) * TILE_E + tl.arange(0, TILE_E)
    carry = tl.zeros([TILE_E], dtype=tl.int32)
    for first in range(0, num_blocks, ROWS):
        rows = first + tl.arange(0, ROWS)
        at = counts + rows[:, None] * BLOCK_E + bins[None, :]
        mask = rows[:, None] < num_blocks
        here = tl.load(at, mask=mask, other=0)
        tl.store(at, carry[None, :] + tl.cumsum(here, 0) - here, mask=mask)
        carry += tl.sum(here, 0)
    tl.store(counts + num_blocks * BLOCK_E + bins, carry)


@triton.jit
def _block_scatter_kernel(ids, counts, order, offsets, block_start, num_pairs, num_blocks, EXPERTS: tl.constexpr,
                          BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """order[rank(i)] = i for this block's pairs, rank(i) = (pairs of smaller experts) + (pairs of its
    expert in earlier blocks) + (pairs of its expert before i in this block). Program 0 also writes
    offsets[e] (first sorted pair of expert e) and block_start[e] (its first block), [E + 1]."""
    TRASH: tl.constexpr = BLOCK_E - 1  # the lanes past the last pair, as in the histogram
    block = tl.program_id(0)
    bins = tl.arange(0, BLOCK_E)
    totals = tl.load(counts + num_blocks * BLOCK_E + bins, mask=bins < EXPERTS, other=0)
    run_start = tl.cumsum(totals, 0) - totals
    if block == 0:
        blocks = (totals + BLOCK_M - 1) // BLOCK_M
        tl.store(offsets + bins, run_start, mask=bins <= EXPERTS)
        tl.store(block_start + bins, tl.cumsum(blocks, 0) - blocks, mask=bins <= EXPERTS)

    next_rank = run_start + tl.load(counts + block * BLOCK_E + bins)  # of each expert's next pair
    t = tl.arange(0, TILE)
    for first in range(block * BLOCK, tl.minimum(block * BLOCK + BLOCK, num_pairs), TILE):
        i = first + t
        valid = i < num_pairs
        id_i = tl.load(ids + i, mask=valid, other=TRASH).to(tl.int32)
        same_before = (id_i[None, :] == id_i[:, None]) & (t[None, :] < t[:, None])  # in this tile
        rank = tl.gather(next_rank, id_i, 0) + tl.sum(same_before.to(tl.int32), 1)
        tl.store(order + rank, i.to(tl.int64), mask=valid)
        next_rank += tl.histogram(id_i, BLOCK_E)


def _block_counting_sort(flat_ids: torch.Tensor, num_experts: int, block_m: int, block: int = SORT_BLOCK,
                         tile: int = RANK_TILE, num_warps: int = 4):
    """(order, offsets, block_start) by the block-wise counting sort (see SORT_BLOCK)."""
    pairs, device = flat_ids.shape[0], flat_ids.device
    bins = triton.next_power_of_2(num_experts + 2)
    blocks = max(1, triton.cdiv(pairs, block))
    counts = torch.empty((blocks + 1, bins), dtype=torch.int32, device=device)
    order = torch.empty(pairs, dtype=torch.int64, device=device)
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    block_start = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    _block_histogram_kernel[(blocks,)](flat_ids, counts, pairs, BLOCK_E=bins, BLOCK=block, num_warps=num_warps)
    scan_bins = min(SCAN_EXPERTS, bins)
    _block_scan_kernel[(bins // scan_bins,)](counts, blocks, BLOCK_E=bins, TILE_E=scan_bins, ROWS=SCAN_ROWS,
                                             num_warps=4)
    _block_scatter_kernel[(blocks,)](flat_ids, counts, order, offsets, block_start, pairs, blocks,
                                     EXPERTS=num_experts, BLOCK_E=bins, BLOCK_M=block_m, BLOCK=block,
                                     TILE=tile, num_warps=num_warps)
    return order, offsets, block_start


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int):
    """(order, offsets [E+1], block_start [E+1], max_blocks) for the flattened (token, choice) pairs:
    order lists the pairs stably sorted by expert (as `sort(stable=True).indices`), unrouted ones last."""
    flat = ids.flatten()
    pairs = flat.shape[0]
    if pairs <= COUNTING_SORT_MAX_PAIRS:
        order, offsets, block_start = _count_and_rank(flat, num_experts, block_m)
    else:
        order, offsets, block_start = _block_counting_sort(flat, num_experts, block_m)
    # Each touched expert needs ceil(count / block_m) <= count blocks, and at most one partial one.
    max_blocks = min(pairs, triton.cdiv(pairs, block_m) + min(num_experts, pairs))
    return order, offsets, block_start, max_blocks


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                ids: torch.Tensor, tiles: tuple[int, ...] | None = None, path: str | None = None,
                partial: bool = False) -> torch.Tensor | PartialSums:
    """Same contract as the reference: x [T, H]; w13 [E, 2I, H]; w2 [E, H, I]; weights/ids [T, k].

    path: "direct" (unsorted, per pair) or "sorted" (grouped GEMM); by default direct up to
    DIRECT_MAX_PAIRS pairs. tiles overrides the chosen path's tiles (a prefix of them): for "sorted"
    see SortedTiles, for "direct" see triton_moe_direct.DirectTiles. partial: the caller takes
    PartialSums, which the direct path returns (the sorted path's combine sums the choices itself)."""
    if path is None:
        path = "direct" if ids.numel() <= DIRECT_MAX_PAIRS else "sorted"
    if path == "direct":
        return moe_experts_direct(x, w13, w2, weights, ids, tiles, partial)
    return moe_experts_sorted(x, w13, w2, weights, ids, tiles)


def _tma_fits(w13: torch.Tensor, w2: torch.Tensor, gate_n: int, down_n: int) -> bool:
    """Whether the weights can be read through descriptors of [E * rows, columns]: each expert's rows
    right after the previous one's, rows of 16-byte multiples (the intermediate rows' too), and column
    tiles that never cross from one expert (or from the gate half into the up half) into the next."""
    def stacked(w):
        return w.stride(0) == w.shape[1] * w.stride(1) and (w.stride(1) * w.element_size()) % 16 == 0
    inter_rows_aligned = (w2.shape[2] * w2.element_size()) % 16 == 0
    return (stacked(w13) and stacked(w2) and inter_rows_aligned and (w13.shape[1] // 2) % gate_n == 0
            and w2.shape[1] % down_n == 0)


def _rows_descriptor(w: torch.Tensor, block_rows: int, block_cols: int) -> TensorDescriptor:
    """w [E, R, C] as one [E * R, C] matrix read in [block_rows, block_cols] boxes."""
    return TensorDescriptor(w, [w.shape[0] * w.shape[1], w.shape[2]], [w.stride(1), 1], [block_rows, block_cols])


def moe_experts_sorted(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                       ids: torch.Tensor, tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    x = x if x.stride(-1) == 1 else x.contiguous()
    tokens, hidden = x.shape
    experts, inter_size = w13.shape[0], w13.shape[1] // 2
    top_k = ids.shape[1]
    if tokens == 0:
        return torch.zeros_like(x)
    assert w13.stride(-1) == 1 and w2.stride(-1) == 1
    pairs = tokens * top_k
    default = default_tiles(pairs, experts)
    gu_n, gu_k, dn_n, dn_k, block_m, warps, stages, columns_fast, down_warps, down_stages, tma = (
        SortedTiles(*tiles, *default[len(tiles):]) if tiles else default)
    tma = tma and _tma_fits(w13, w2, gu_n, dn_n)
    order, offsets, block_start, max_blocks = align_pairs(ids, experts, block_m)
    flat_weights = weights.reshape(-1).contiguous()
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    block_e = triton.next_power_of_2(experts + 1)
    inter = torch.empty((pairs, inter_size), dtype=x.dtype, device=x.device)
    # Without TMA the kernels take their tensors in the descriptors' places (and never read them there).
    w13_desc = _rows_descriptor(w13, gu_n, gu_k) if tma else w13
    _moe_gate_up_kernel[_grid(max_blocks, triton.cdiv(inter_size, gu_n), columns_fast)](
        x, w13, w13_desc, order, offsets, block_start, inter, x.stride(0), w13.stride(0), w13.stride(1),
        inter.stride(0), EXPERTS=experts, BLOCK_E=block_e, TOP_K=top_k, HIDDEN=hidden, INTER=inter_size,
        BLOCK_M=block_m, BLOCK_N=gu_n, BLOCK_K=gu_k, PRECISION=precision, COLUMNS_FAST=columns_fast, TMA=tma,
        num_warps=warps, num_stages=stages,
    )
    y = torch.empty((pairs, hidden), dtype=x.dtype, device=x.device)
    inter_desc = TensorDescriptor.from_tensor(inter, [block_m, dn_k]) if tma else inter
    w2_desc = _rows_descriptor(w2, dn_n, dn_k) if tma else w2
    _moe_down_kernel[_grid(max_blocks, triton.cdiv(hidden, dn_n), columns_fast)](
        inter, inter_desc, w2, w2_desc, flat_weights, order, offsets, block_start, y, inter.stride(0), w2.stride(0),
        w2.stride(1), y.stride(0), EXPERTS=experts, BLOCK_E=block_e, HIDDEN=hidden, INTER=inter_size,
        BLOCK_M=block_m, BLOCK_N=dn_n, BLOCK_K=dn_k, PRECISION=precision, COLUMNS_FAST=columns_fast, TMA=tma,
        num_warps=down_warps or warps, num_stages=down_stages or stages,
    )
    out = torch.empty_like(x)
    _combine_kernel[(tokens, triton.cdiv(hidden, COMBINE_BLOCK))](
        y, ids.contiguous(), out, y.stride(0), out.stride(0), TOP_K=top_k, HIDDEN=hidden, EXPERTS=experts,
        BLOCK=COMBINE_BLOCK, num_warps=4)
    return out
