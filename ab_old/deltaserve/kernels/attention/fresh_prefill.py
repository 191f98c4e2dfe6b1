"""Causal attention for prefill chunks that start a sequence: every key a row attends to is in the
chunk itself, so nothing needs to be read back from the paged pool and a dense FlashAttention
kernel (torch's scaled_dot_product_attention) does the work. Same definition as the paged
reference for such chunks; the model uses it only where it is faster (long fresh prompts on GPU)."""

import torch
from torch.nn import functional as F


def causal_attention_fresh(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_start_loc: list[int],
                           scale: float) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hk, D]; sequence b owns rows query_start_loc[b]:[b+1] and starts at position 0."""
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    for start, end in zip(query_start_loc[:-1], query_start_loc[1:]):
        qs, ks, vs = q[start:end], k[start:end], v[start:end]
        if group > 1:  # expanded once per chunk: a copy far smaller than the attention itself
            ks, vs = ks.repeat_interleave(group, dim=1), vs.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None],
                                           vs.transpose(0, 1)[None], is_causal=True, scale=scale)
        out[start:end] = o[0].transpose(0, 1)
    return out
