"""apply_penalties (reference.py) over the rows' token entries alone: two launches after a copy of the logits.

The reference builds a [B, V] prompt mask and [B, V] output counts and reads the logits through some ten
elementwise passes: at 128 rows of a 248k vocabulary, about 2 GB of traffic for a few thousand tokens
that change. Here the copy is the only dense write besides the counts' clearing. The first launch counts
each output entry into an int32 [B * V] scratch with atomics; the second, over the prompt entries and the
output entries together, writes each entry's penalised value computed from the original logits and its
count. An entry listed twice (a repeated token, or a token in both the prompt and the output) is written
by several programs with the same value, so their order does not matter and the host lists no distinct
tokens. The arithmetic is the reference's, in its order, with a correctly rounded division and no
multiply-add contracted into one rounding: the values are the reference's bits.
"""

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _count_outputs(entries, counts, first, n, BLOCK: tl.constexpr):
    offs = first + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    entry = tl.load(entries + offs, mask=mask, other=0)
    tl.atomic_add(counts + entry, tl.full([BLOCK], 1, tl.int32), mask=mask, sem="relaxed")


@triton.jit
def _penalise_entries(logits, logits_row_stride, out, counts, entries, n, vocab, repetition, frequency, presence,
                      BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    entry = tl.load(entries + offs, mask=mask, other=0)
    row = entry // vocab
    x = tl.load(logits + row * logits_row_stride + (entry - row * vocab), mask=mask, other=0.0)
    count = tl.load(counts + entry, mask=mask, other=0).to(tl.float32)
    rep = tl.load(repetition + row, mask=mask, other=1.0)
    penalised = tl.where(x > 0, tl.math.div_rn(x, rep), x * rep)
    value = penalised - tl.load(frequency + row, mask=mask, other=0.0) * count
    value = value - tl.load(presence + row, mask=mask, other=0.0) * (count > 0).to(tl.float32)
    tl.store(out + entry, value, mask=mask)


def apply_penalties(logits: torch.Tensor, prompt_entries: torch.Tensor, output_entries: torch.Tensor,
                    repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """reference.apply_penalties; logits [B, V] fp32 with unit stride along V (a view of wider rows too)."""
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    rows, vocab = logits.shape
    out = torch.empty((rows, vocab), dtype=torch.float32, device=logits.device)
    out.copy_(logits)
    entries = torch.cat([prompt_entries, output_entries])
    n, first = len(entries), len(prompt_entries)
    if n == 0:
        return out
    counts = torch.zeros(rows * vocab, dtype=torch.int32, device=logits.device)
    if n > first:
        _count_outputs[(triton.cdiv(n - first, BLOCK),)](entries, counts, first, n, BLOCK=BLOCK)
    _penalise_entries[(triton.cdiv(n, BLOCK),)](logits, logits.stride(0), out, counts, entries, n, vocab,
                                                repetition, frequency, presence, BLOCK=BLOCK,
                                                enable_fp_fusion=False)  # f * count - ... stays two roundings
    return out
