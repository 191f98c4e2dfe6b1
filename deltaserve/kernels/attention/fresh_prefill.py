"""Causal attention for prefill chunks that start a sequence: every key a row attends to is in the
chunk itself, so nothing needs to be read back from the paged pool and a dense fused attention
kernel (torch's scaled_dot_product_attention) does the work. Same definition as the paged
reference for such chunks; the model uses it on the GPU for first chunks longer than the prefill graphs'
last rung, 2048 rows (model_runner.FRESH_PREFILL_MIN_TOKENS): up to there paged attention is as fast. Each
new prompt length costs the host a cuDNN plan, 54-57 ms at the Qwen3.5-9B shape between 1100 and 2048
tokens, where the same length again took under 0.5 ms (fresh_attention_new_lengths_at_1c13f5a.json).

sdpa picks its backend itself: cuDNN's on the H200, which at this head size (256) takes half the time
of FlashAttention's (878 against 1895 us at 8k tokens, 14.0 against 28.5 ms at 32k; kernels_check
fresh_attention). cuDNN has a cost beyond its call: once it has started in a process (cudnnCreate alone
does it, before any kernel of it runs), the decode graphs replayed after it run slower for the rest of
the process. The Qwen3.5-9B shape's graph, replayed back to back, took 0.11 ms longer at 24 and 32 rows
but 0.008 ms at 16, where the skinny Triton GEMM takes the output and down projections instead of
cuBLAS; with DELTASERVE_PDL=0 the 32-row steps were as slow before cuDNN as after (5.967 ms), so what it
takes is what programmatic dependent launch gained there: traced, each cuBLAS GEMM and the kernel after
it start about 0.4 us later than before (benchmarks/graph_timeline.py), behind the same graph edges. The
context's limits, flags and cache config stayed as they were; eager module loading, cuDNN's GRAPH_JIT_ONLY
library config, CUDA_DEVICE_MAX_CONNECTIONS=1 or 32 and the largest shared-memory carveout for every Triton
kernel did not avoid it, and none of cudnnCreate's CUDA calls made alone on the default stream, nor cuDNN's
libraries loaded without a call, caused it; any work on a second stream did, as much (one small kernel,
one memset), also with the steps on a stream of their own, and cuDNN makes streams of its own as it starts
(warm_up_cost.py's triggers).
The paged kernel's long-chunk tiles took 42.6 us at 1024 rows against cuDNN's 29.6, and 89.3 at 2048
against 89.2 (paged_attention_prefill.json).
Where the step budget holds one (not the default 2048 tokens), the start-up warm-up's long pass starts cuDNN.
Without cuDNN the 9B shape's steps were 1.7% (32 rows) and 1.0% (128 rows) shorter but its first token 3-10%
later at 8k tokens (12-14% at the 35B-A3B shape) and 13% at 32k, so cuDNN stays (warm_up_cost_*.json,
engine_*_fresh_attention_backend_same_machine.json)."""

import torch
from torch.nn import functional as F


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
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return o[0].transpose(0, 1)
