"""The sampler's race (reference.race) and the greedy argmax in one pass over the logits.

Each row's tokens are cut into slices of SLICE_BLOCKS blocks; program (row, slice) keeps the best score of its slice
and its first index, and one program per row then takes the best of the slices, the first on ties (as
torch's argmax). A greedy row scores its logits as they are; a sampled row scores x * inverse temperature
plus the Gumbel variable of its seed's draw for the token, hashed in the kernel (reference.uniforms), so
no noise tensor is written or read. One read of the logits replaces the reference's noise, softmax,
divisions and argmaxes. Where top-p or min-p give a sampled row a floor (triton_nucleus.py), its tokens
below the floor are dropped in the same read.
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid
from deltaserve.kernels.sampling.reference import GOLDEN, MIX_A, MIX_B, MaskPlan, mask_sorted
from deltaserve.kernels.sampling.triton_nucleus import nucleus_floors, order_key
from deltaserve.kernels.sampling.triton_top_k import top_k as top_k_candidates

BLOCK = 2048
SLICE_BLOCKS = 4  # blocks a program walks: rows of the 9B shape's 248320 tokens take 31 slices
_GOLDEN = tl.constexpr(GOLDEN)
_MIX_A = tl.constexpr(MIX_A)
_MIX_B = tl.constexpr(MIX_B)


@triton.jit
def _gumbel(seed, index):
    """-log(-log u) of the draw u of token `index` (int64) for a row of `seed` (uint64): reference.uniforms."""
    x = seed + (index + 1).to(tl.uint64) * _GOLDEN
    x = x ^ (x >> 30)
    x = x * _MIX_A
    x = x ^ (x >> 27)
    x = x * _MIX_B
    x = x ^ (x >> 31)
    u = ((x >> 41).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2^-23
    return -tl.log(-tl.log(u))


@triton.jit
def _first_best(score, index):
    """(best score, its first index) of a block of scores and their indices: torch.argmax's tie rule."""
    top = tl.max(score, 0)
    return top, tl.min(tl.where(score == top, index, 2**31 - 1), 0)


@triton.jit
def _race_slices_kernel(x, inverse, seeds, greedy, floors, best_score, best_index, vocab, stride_x, slices,
                        BLOCK: tl.constexpr, SLICE_BLOCKS: tl.constexpr, ALL_GREEDY: tl.constexpr,
                        HAS_FLOORS: tl.constexpr, USE_PDL: tl.constexpr = False):
    """ALL_GREEDY: every row takes its argmax; inverse, seeds, greedy and floors are not read. HAS_FLOORS:
    a sampled row's scaled logits whose order key is under its floor (triton_nucleus) are dropped."""
    wait_for_prior_grid(USE_PDL)
    row, part = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if ALL_GREEDY:
        is_greedy, scale, seed = True, 1.0, 0
    else:
        is_greedy = tl.load(greedy + row) != 0
        scale = tl.load(inverse + row)
        seed = tl.load(seeds + row).to(tl.uint64)
    if HAS_FLOORS:
        floor = tl.load(floors + row)
    score = tl.full([BLOCK], float("-inf"), tl.float32)
    # each lane starts at its first column: a row that refuses every token (-inf throughout) takes token 0, as
    # torch's argmax does, rather than an index past the vocabulary that the next step would read as its input
    index = part * SLICE_BLOCKS * BLOCK + tl.arange(0, BLOCK)
    for b in range(SLICE_BLOCKS):
        cols = (part * SLICE_BLOCKS + b) * BLOCK + tl.arange(0, BLOCK)
        live = cols < vocab
        value = tl.load(x + row * stride_x + cols, mask=live, other=float("-inf"))
        if not is_greedy:  # past the vocabulary -inf stays -inf: the scale is positive, the noise finite
            value = value * scale
            if HAS_FLOORS:
                value = tl.where(order_key(value) >= floor, value, float("-inf"))
            value = value + _gumbel(seed, cols.to(tl.int64))
        better = value > score  # later blocks have larger indices: a tie keeps the first
        score = tl.where(better, value, score)
        index = tl.where(better, cols, index)
    top, first = _first_best(score, index)
    tl.store(best_score + row * slices + part, top)
    tl.store(best_index + row * slices + part, first)


@triton.jit
def _race_rows_kernel(best_score, best_index, tokens, slices, BLOCK_S: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_prior_grid(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_S)
    live = offs < slices
    score = tl.load(best_score + row * slices + offs, mask=live, other=float("-inf"))
    index = tl.load(best_index + row * slices + offs, mask=live, other=2**31 - 1)
    tl.store(tokens + row, _first_best(score, index)[1].to(tl.int64))


@triton.jit
def _race_candidates_kernel(values, indices, seeds, tokens, count, BLOCK_K: tl.constexpr):
    """Program per row: the race over its candidates (masked and scaled values, their token indices), as
    _race_slices_kernel runs it over the whole row: the same noise a token, the lowest index on ties."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    live = offs < count
    value = tl.load(values + row * count + offs, mask=live, other=float("-inf"))
    index = tl.load(indices + row * count + offs, mask=live, other=0)
    score = value + _gumbel(tl.load(seeds + row).to(tl.uint64), index)
    top = tl.max(score, 0)
    tl.store(tokens + row, tl.min(tl.where(score == top, index, 2**62), 0))


def race_or_argmax(x: torch.Tensor, inverse: torch.Tensor | None, seeds: torch.Tensor | None,
                   greedy: torch.Tensor | None, out: torch.Tensor | None = None,
                   floors: torch.Tensor | None = None) -> torch.Tensor:
    """tokens [B] (int64, into `out` where given): argmax of x where greedy[b], else
    reference.race(x * inverse[b], seeds[b]), less the tokens whose x * inverse[b] has an order key under
    floors[b] where given; greedy None: every row's argmax. x [B, V] float32 (last dim contiguous);
    inverse [B] float32; seeds [B] int64; greedy [B] bool; floors [B] int32."""
    rows, vocab = x.shape
    tokens = out if out is not None else torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return tokens
    assert x.stride(-1) == 1 and x.dtype == torch.float32
    slices = triton.cdiv(vocab, BLOCK * SLICE_BLOCKS)
    best_score = torch.empty(rows, slices, dtype=torch.float32, device=x.device)
    best_index = torch.empty(rows, slices, dtype=torch.int32, device=x.device)
    all_greedy = greedy is None
    # ALL_GREEDY reads no inverse, seeds, greedy flags or floors: x stands in for those pointers
    rows_in = (x, x, x) if all_greedy else (inverse, seeds, greedy.to(torch.int32))
    _race_slices_kernel[(rows, slices)](
        x, *rows_in, x if floors is None else floors, best_score, best_index, vocab, x.stride(0), slices,
        BLOCK=BLOCK, SLICE_BLOCKS=SLICE_BLOCKS, ALL_GREEDY=all_greedy, HAS_FLOORS=floors is not None and not all_greedy,
        num_warps=8, **launch_options(x),
    )
    _race_rows_kernel[(rows,)](best_score, best_index, tokens, slices, BLOCK_S=triton.next_power_of_2(slices),
                               num_warps=1, **launch_options(x))
    return tokens


def greedy_tokens(logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[b] = the first argmax of logits[b] (float32 rows, last dim contiguous), as torch.argmax."""
    return race_or_argmax(logits, None, None, None, out)


def sample_from_logits(logits, temperature, top_k, top_p, min_p, seeds, *, mask: MaskPlan) -> torch.Tensor:
    """reference.sample_from_logits with the race and the greedy argmax in the kernels above. Top-p and
    min-p in rows without top-k are floors the race applies (triton_nucleus); rows with top-k are masked by
    the reference's masks over their best mask.top_k tokens (triton_top_k), never a sort of the
    vocabulary. Greedy rows' best token is never masked."""
    greedy = temperature <= 0
    inverse = torch.where(greedy, 1.0, 1.0 / temperature)
    x = logits.float()
    x = x if x.stride(-1) == 1 else x.contiguous()  # rows may stand apart (a wider logits buffer): strides
    if not mask.top_k:
        floors = nucleus_floors(x, inverse, top_p, min_p, with_min_p=mask.min_p) if mask.nucleus else None
        return race_or_argmax(x, inverse, seeds, greedy, floors=floors)
    vocab = x.shape[1]
    best, order = top_k_candidates(x, min(mask.top_k, vocab))  # a positive scale keeps the order
    masked = mask_sorted(best * inverse[:, None], top_k, top_p, min_p, vocab)
    if mask.all_top_k:
        sampled = _race_candidates(masked, order, seeds)
        return torch.where(greedy, race_or_argmax(x, None, None, None), sampled) if mask.greedy_rows else sampled
    # Rows without top-k would lose all but their best mask.top_k tokens: they keep their scaled logits and
    # take floors for their top-p and min-p, which rows with top-k switch off (masked already).
    has_k = top_k > 0
    scaled = x * inverse[:, None]
    x = torch.where(has_k[:, None], torch.full_like(x, float("-inf")).scatter_(-1, order, masked), scaled)
    unit = torch.ones_like(inverse)
    floors = None
    if mask.nucleus:
        floors = nucleus_floors(x, unit, torch.where(has_k, 1.0, top_p), torch.where(has_k, 0.0, min_p),
                                with_min_p=mask.min_p)
    return race_or_argmax(x, unit, seeds, greedy, floors=floors)


def _race_candidates(values: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """tokens [B]: each row's race over its candidates (values [B, n] float32, indices [B, n] int64)."""
    rows, count = values.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=values.device)
    _race_candidates_kernel[(rows,)](values.contiguous(), indices.contiguous(), seeds, tokens, count,
                                     BLOCK_K=triton.next_power_of_2(count), num_warps=4)
    return tokens
