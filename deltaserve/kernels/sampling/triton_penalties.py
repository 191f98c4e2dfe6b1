"""Repetition, frequency and presence penalties (reference.apply_penalties_at) as one pass over the entries
that a batch's prompts and outputs name: a program per BLOCK entries reads each entry's logit, penalises it
and writes it back, so the work follows the tokens seen, not rows x vocabulary (the dense reference builds
a prompt mask and output counts the size of the logits every step).
"""

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _penalties_kernel(out, seen, counts, repetition, frequency, presence, entries, vocab, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < entries
    flat = tl.load(seen + offs, mask=live, other=0)  # row * vocab + token, distinct: no two programs share one
    row = flat // vocab
    x = tl.load(out + flat, mask=live, other=0.0)
    rep = tl.load(repetition + row, mask=live, other=1.0)
    count = tl.load(counts + offs, mask=live, other=0.0)
    x = tl.where(x > 0, tl.math.div_rn(x, rep), x * rep) - tl.load(frequency + row, mask=live, other=0.0) * count
    x = x - tl.load(presence + row, mask=live, other=0.0) * (count > 0).to(tl.float32)
    tl.store(out + flat, x, mask=live)


def apply_penalties_at(logits: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor, repetition: torch.Tensor,
                       frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """reference.apply_penalties_at: a penalised float32 copy of logits [B, V]; seen [N] int64 (row * V +
    token, distinct), counts [N] float32; repetition, frequency, presence [B] float32."""
    out = logits.float().clone(memory_format=torch.contiguous_format)
    entries = seen.shape[0]
    if entries:
        _penalties_kernel[(triton.cdiv(entries, BLOCK),)](out, seen, counts, repetition, frequency, presence, entries,
                                                          out.shape[1], BLOCK=BLOCK, num_warps=4)
    return out
