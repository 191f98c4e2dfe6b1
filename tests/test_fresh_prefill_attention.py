"""Dense attention over fresh prefill chunks equals the paged reference on the same rows."""

import random

import pytest
import torch

from deltaserve.kernels.attention.fresh_prefill import causal_attention_fresh
from deltaserve.kernels.attention.reference import paged_attention, store_kv


@pytest.mark.parametrize("sequences", [1, 4])  # one sequence returns sdpa's output uncopied
def test_fresh_chunks_equal_paged_reference(sequences):
    rng = random.Random()
    lengths = [rng.randint(1, 40) for _ in range(sequences - 1)] + [rng.randint(1, 40) if sequences == 1 else 1]
    heads, kv_heads, dim, page = 4, 2, 16, 8
    total = sum(lengths)
    q, k, v = torch.randn(total, heads, dim), torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    blocks_per_seq = max(-(-n // page) for n in lengths)
    k_cache = torch.zeros(len(lengths) * blocks_per_seq, page, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.arange(len(lengths) * blocks_per_seq).reshape(len(lengths), blocks_per_seq)
    slots = torch.cat([tables[b, torch.arange(n) // page] * page + torch.arange(n) % page
                       for b, n in enumerate(lengths)])
    store_kv(k, v, k_cache, v_cache, slots)
    expected = paged_attention(q, k_cache, v_cache, torch.tensor(starts), torch.tensor(lengths), tables, 0.3)
    torch.testing.assert_close(causal_attention_fresh(q, k, v, starts, 0.3), expected, atol=1e-5, rtol=1e-5)
