"""Causal attention for prefill chunks that start a sequence: every key a row attends to is in the
chunk itself, so nothing needs to be read back from the paged pool and a dense FlashAttention
kernel (torch's scaled_dot_product_attention) does the work. Same definition as the paged
reference for such chunks; the model uses it only where it is faster (long fresh prompts on GPU).

sdpa may pick any backend but cuDNN's. On the H200 (torch 2.11, CUDA 13) one cuDNN attention call, at
any point of the process, made every later decode step of the Qwen3.5-9B shape about 0.11 ms slower
(5.775 -> 5.887 ms at 32 rows), its kernels' times unchanged, for as long as the process lived; with
FlashAttention the steps stayed at 5.78 ms (warm_up_cost_*.json). cuDNN's kernel is the faster one at 8k
tokens (a fresh 8k prompt's first token 0.200 s against 0.206-0.209 s), but a server pays the decode
cost on every step after its first long prompt."""

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Every sdpa backend but cuDNN's (see above): FlashAttention where it applies (bf16 and fp16), the
# memory-efficient kernel or the math one otherwise (fp32 checkpoints, the CPU).
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def causal_attention_fresh(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_start_loc: list[int],
                           scale: float) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hk, D]; sequence b owns rows query_start_loc[b]:[b+1] and starts at position 0.
    Returns [T, Hq, D]; for one sequence sdpa's own output seen through a transpose (not copied: the
    output gate or the output projection's reshape reads it where it lies)."""
    if len(query_start_loc) == 2:
        return _one_sequence(q, k, v, scale)
    out = torch.empty_like(q)
    for start, end in zip(query_start_loc[:-1], query_start_loc[1:]):
        out[start:end] = _one_sequence(q[start:end], k[start:end], v[start:end], scale)
    return out


def _one_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # enable_gqa reads each key head for its group of query heads: no expanded copies of k and v. On the
    # H200 at 8192 tokens (16 query heads, 2 or 4 key heads, dim 256) it took 869 us against 1023 for
    # repeat_interleave and the same kernel, with the same output bit for bit (fresh_attention.json).
    with sdpa_kernel(BACKENDS):
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], is_causal=True, scale=scale,
                                           enable_gqa=q.shape[1] != k.shape[1])
    return o[0].transpose(0, 1)
