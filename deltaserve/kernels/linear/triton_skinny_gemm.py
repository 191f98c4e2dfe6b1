"""y = x @ W^T for a few rows of x (decode): a GEMM whose time is reading W once.

One program per BLOCK_N rows of W walks the whole K dimension, its loads pipelined (num_stages), and
multiplies the tile by the rows of x padded to 16 on the tensor cores (the padding costs nothing the
memory does not already pay for). No atomics: a row's sum is taken in the same order every time.
cuBLAS picks split-K kernels and a reduction for some of these shapes at one row and stays below
the bandwidth the matrix reads allow.

A weight of few rows (a 2048-wide model's output projections, an MoE router) leaves too few programs
to read at full bandwidth. `skinny_gemm_parts` splits its K into slices, one program per (n tile,
slice), and returns the slices' sums as PartialSums for the consumer to add up (partial_sums.py).
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from deltaserve.kernels.partial_sums import PartialSums
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid


@triton.jit
def _skinny_gemm_kernel(x, w, y, M, N, stride_xm, stride_wn, stride_ym, stride_ys, K: tl.constexpr,
                        K_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr,
                        USE_PDL: tl.constexpr = False):
    """Program (n tile, split): K columns [split * K_PER_SPLIT, +K_PER_SPLIT) into y[split]."""
    wait_for_prior_grid(USE_PDL)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_first = split * K_PER_SPLIT
    for k0 in tl.range(k_first, k_first + K_PER_SPLIT, BLOCK_K, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(x + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0)
        b = tl.load(w + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :],
                    mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    tl.store(y + split * stride_ys + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


class SkinnyTiles(NamedTuple):
    block_n: int
    block_k: int
    stages: int
    warps: int


# Up to this many rows the dispatch takes the skinny GEMM (see faster_than_cublas). Above, cuBLAS: at 64
# and 128 rows the best tall tiles measured no faster on 19 of the 20 projections of the benchmark shapes
# (benchmarks/results/skinny_gemm_tall.json; 9B down projection at 128 rows 55.7 vs 33.3 us). At 24 and 32
# rows the GDN input projections alone read 1.2-1.9 us faster here, with 32 x 128 tiles in 3 stages
# (split_gemm_skinny_rows.json), but in the 9B shape's decode graphs the step took 6.022-6.024 against
# 5.965 ms at 32 sequences and 5.775 against 5.729-5.732 at 24 (engine_qwen3.5-9b_tall_skinny_same_machine.json).
MAX_ROWS = 16
MAX_TILE_ROWS = 128  # the most rows one program covers (x padded to a power of two from 16)


def faster_than_cublas(n: int) -> bool:
    """Where the skinny GEMM measured faster than cuBLAS for a weight of n rows (see default_tiles):
    not below 1024 rows (too few programs), and between 4096 and 65536 rows only when n is not a
    multiple of 1024: cuBLAS's tiles then divide the weight evenly and it reads it at full speed."""
    if n < 1024:
        return False
    return n <= 4096 or n > 65536 or n % 1024 != 0


def default_tiles(n: int) -> SkinnyTiles:
    """Enough programs to keep every SM reading (about 128 or more), long K steps when there are few,
    and no register spills on sm_90. On the H200 at the Qwen3.5 shapes, one row, against cuBLAS
    (benchmarks/results/skinny_gemm.json): 26.5 vs 29.4 us for the 4096x12288 down projection, 26.3
    vs 28.3 us for 12352x4096, 7.8 vs 10.6 us for 4096x4096, 442 vs 473 us for the 248320x4096 LM
    head, 12.9 vs 15.1 us for 12352x2048; cuBLAS stays ahead by 1-2 us for 24576x4096, 10240x4096 and
    9216x2048, a fraction of what the others gain."""
    if n <= 2048:
        return SkinnyTiles(16, 1024, 3, 4)
    if n <= 4096:
        return SkinnyTiles(32, 512, 3, 4)
    if n <= 65536:
        return SkinnyTiles(32, 128, 6, 4)
    return SkinnyTiles(64, 128, 5, 4)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, tiles: tuple[int, ...] | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M <= 128, K]; weight [N, K] (last dim contiguous); returns [M, N] in out_dtype (x's dtype by
    default; the fp32 accumulator is rounded once, to it)."""
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    _launch(x, weight, y, 1, SkinnyTiles(*tiles) if tiles else default_tiles(n))
    return y


# Weights of at most this many rows are too short to keep every SM reading: split along K, they give
# up to SPLIT_PROGRAMS (n tile, split) programs, each reading a whole number of SPLIT_K columns.
MAX_SPLIT_ROWS = 2048
SPLIT_PROGRAMS = 512
MIN_SPLIT_PROGRAMS = 128  # fewer than about one per SM: leave the weight to cuBLAS
# On the H200 at one row (benchmarks/results/skinny_gemm_split.json): the 2048x4096 output projection
# in 4 slices 5.2 us (unsplit 7.3, cuBLAS 7.3); the 264x2048 MoE router in 16 slices 2.2 us (cuBLAS 5.1).
# Slices of 256 columns with 4-warp programs measured 7.5 and 2.5.
SPLIT_K = 128
SPLIT_TILES = SkinnyTiles(16, SPLIT_K, 4, 2)


def k_splits(n: int, k: int) -> int:
    """How many K slices the skinny GEMM of a weight [n, k] runs as (1: unsplit). Slices are equal
    multiples of SPLIT_K; splits double while the programs stay within SPLIT_PROGRAMS."""
    if n > MAX_SPLIT_ROWS:
        return 1
    n_tiles, splits = triton.cdiv(n, SPLIT_TILES.block_n), 1
    while n_tiles * splits * 2 <= SPLIT_PROGRAMS and k % (splits * 2 * SPLIT_K) == 0:
        splits *= 2
    return splits if n_tiles * splits >= MIN_SPLIT_PROGRAMS else 1


def skinny_gemm_parts(x: torch.Tensor, weight: torch.Tensor, splits: int | None = None,
                      tiles: tuple[int, ...] | None = None) -> PartialSums:
    """x @ weight^T as PartialSums: one fp32 part per K slice, left for the consumer to add up."""
    m, k = x.shape
    n = weight.shape[0]
    tiles = SkinnyTiles(*tiles) if tiles else SPLIT_TILES
    splits = splits or k_splits(n, k)
    assert k % splits == 0, (k, splits)
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    _launch(x, weight, parts, splits, tiles)
    return PartialSums(parts, x.dtype)


def _launch(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, splits: int, tiles: SkinnyTiles) -> None:
    """y [splits, M, N] (or [M, N] when unsplit): slice s of K into y[s]."""
    m, k = x.shape
    n = weight.shape[0]
    assert m <= MAX_TILE_ROWS and weight.stride(-1) == 1
    if m == 0:
        return
    x = x if x.stride(-1) == 1 else x.contiguous()
    k_per_split = k // splits
    block_k = min(tiles.block_k, triton.next_power_of_2(k_per_split))
    # A slice must be whole BLOCK_K steps, or two programs would read the columns between them.
    assert splits == 1 or k_per_split % block_k == 0, (k_per_split, block_k)
    _skinny_gemm_kernel[(triton.cdiv(n, tiles.block_n), splits)](
        x, weight, y, m, n, x.stride(0), weight.stride(0), y.stride(-2), y.stride(0) if splits > 1 else 0, K=k,
        K_PER_SPLIT=k_per_split, BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=tiles.block_n,
        BLOCK_K=block_k, STAGES=tiles.stages, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.warps, **launch_options(x),
    )
