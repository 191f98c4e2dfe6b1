"""apply_penalties (reference.py) over the rows' token lists alone: two launches after a copy of the logits.

The reference builds a [B, V] prompt mask and [B, V] output counts and reads the logits through some ten
elementwise passes: at 128 rows of a 248k vocabulary about 2 GB of traffic, for a few thousand tokens
that change. Here the copy is the only dense write besides the counts' clearing. Programs take a chunk of
one row's list (grid: rows x chunks of the longest list). The first launch counts each output token into an
int32 [B * V] scratch with atomics; the second, over the prompt lists and the output lists, writes each
token's penalised value computed from the original logits and its count. A token listed twice (a repeat,
or a token in both lists) is written by several programs with the same value, so their order does not
matter and no list needs its distinct tokens. The arithmetic is the reference's, in its order, with a
correctly rounded division and no multiply-add contracted into one rounding: the values are the
reference's bits.
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.sampling.reference import RowTokens

BLOCK = 1024


@triton.jit
def _chunk(tokens, offsets, row, BLOCK: tl.constexpr):
    """The tokens of this program's chunk of `row`'s list, and which of them exist."""
    start, end = tl.load(offsets + row), tl.load(offsets + row + 1)
    index = start + tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    present = index < end
    return tl.load(tokens + index, mask=present, other=0).to(tl.int64), present


@triton.jit
def _count_outputs(tokens, offsets, counts, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    token, present = _chunk(tokens, offsets, row, BLOCK)
    tl.atomic_add(counts + row.to(tl.int64) * vocab + token, tl.full([BLOCK], 1, tl.int32), mask=present,
                  sem="relaxed")


@triton.jit
def _penalise_list(logits, logits_row_stride, out, counts, tokens, offsets, vocab, repetition, frequency, presence,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    token, present = _chunk(tokens, offsets, row, BLOCK)
    entry = row.to(tl.int64) * vocab + token
    x = tl.load(logits + row.to(tl.int64) * logits_row_stride + token, mask=present, other=0.0)
    count = tl.load(counts + entry, mask=present, other=0).to(tl.float32)
    rep = tl.load(repetition + row)
    penalised = tl.where(x > 0, tl.math.div_rn(x, rep), x * rep)
    value = penalised - tl.load(frequency + row) * count
    value = value - tl.load(presence + row) * (count > 0).to(tl.float32)
    tl.store(out + entry, value, mask=present)


@triton.jit
def _penalise_kernel(logits, logits_row_stride, out, counts, prompt_tokens, prompt_offsets, output_tokens,
                     output_offsets, vocab, repetition, frequency, presence, BLOCK: tl.constexpr):
    """Grid (rows, chunks, 2): axis 2 picks the prompt's list or the output's."""
    if tl.program_id(2) == 0:
        _penalise_list(logits, logits_row_stride, out, counts, prompt_tokens, prompt_offsets, vocab, repetition,
                       frequency, presence, BLOCK)
    else:
        _penalise_list(logits, logits_row_stride, out, counts, output_tokens, output_offsets, vocab, repetition,
                       frequency, presence, BLOCK)


def apply_penalties(logits: torch.Tensor, prompt: RowTokens, output: RowTokens, repetition: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """reference.apply_penalties; logits [B, V] fp32 with unit stride along V (a view of wider rows too)."""
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    rows, vocab = logits.shape
    out = torch.empty((rows, vocab), dtype=torch.float32, device=logits.device)
    out.copy_(logits)
    longest = max(prompt.longest, output.longest)
    if rows == 0 or longest == 0:
        return out
    counts = torch.zeros(rows * vocab, dtype=torch.int32, device=logits.device)
    if output.longest:
        _count_outputs[(rows, triton.cdiv(output.longest, BLOCK))](output.tokens, output.offsets, counts, vocab,
                                                                    BLOCK=BLOCK)
    # an empty list passes no tensor: the other takes its place, and axis 2 of the grid covers one list
    first, second = (prompt, output) if prompt.longest else (output, prompt)
    second, lists = (second, 2) if second.longest else (first, 1)
    _penalise_kernel[(rows, triton.cdiv(longest, BLOCK), lists)](
        logits, logits.stride(0), out, counts, first.tokens, first.offsets, second.tokens, second.offsets, vocab,
        repetition, frequency, presence, BLOCK=BLOCK,
        enable_fp_fusion=False)  # f * count, then the subtraction: two roundings, as the reference's
    return out
