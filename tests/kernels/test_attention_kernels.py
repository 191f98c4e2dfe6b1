import pytest
import torch

from deltaserve.kernels.attention import reference
from deltaserve.kernels.attention.triton_paged_attention import paged_attention
from deltaserve.kernels.attention.triton_store_kv import store_kv
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


def _paged_pools(seq_lens, page, kv_heads, head_dim, spare=3):
    blocks_per_seq = [-(-s // page) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare
    k_cache = torch.randn(num_blocks, page, kv_heads, head_dim)
    v_cache = torch.randn(num_blocks, page, kv_heads, head_dim)
    perm = torch.randperm(num_blocks)  # pages scattered through the pool
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq) + 1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = perm[used:used + n]
        used += n
    return k_cache, v_cache, tables


@pytest.mark.parametrize("q_heads,kv_heads,head_dim,page", [(4, 2, 24, 4), (8, 2, 16, 16), (3, 3, 32, 5)])
def test_paged_attention_ragged_prefill_and_decode(q_heads, kv_heads, head_dim, page):
    seq_lens = [1, 13, 7, 4, 30]
    q_lens = [1, 13, 1, 0, 5]  # a fresh 1-token prompt, a whole prompt, a decode row, no rows, a chunk with history
    k_cache, v_cache, tables = _paged_pools(seq_lens, page, kv_heads, head_dim)
    starts = torch.tensor([0] + q_lens).cumsum(0)
    q = torch.randn(sum(q_lens), q_heads, 2 * head_dim)[..., :head_dim]  # strided view, as the model passes
    lens = torch.tensor(seq_lens)
    expected = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3)
    assert_close(paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3), expected)
    assert_close(paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3, block_m=16, block_n=16), expected)
    assert_close(paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3, splits=4), expected)


@pytest.mark.parametrize("splits", [None, 1, 2, 8])
def test_paged_attention_decode_batch(splits):
    seq_lens = [3, 17, 9, 40]  # with 8 splits of whole 16-key tiles, some splits get no keys
    k_cache, v_cache, tables = _paged_pools(seq_lens, 8, 2, 16)
    q = torch.randn(4, 8, 16)
    starts, lens = torch.arange(5), torch.tensor(seq_lens)
    expected = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.25)
    out = paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.25, block_n=16, splits=splits)
    assert_close(out, expected)


def test_store_kv_skips_padding():
    tokens, heads, dim, page, blocks = 7, 2, 24, 4, 5
    k, v = torch.randn(tokens, heads, 2 * dim)[..., :dim], torch.randn(tokens, heads, dim)
    slots = torch.randperm(page * blocks)[:tokens]
    slots[3] = -1
    k_cache, v_cache = torch.randn(blocks, page, heads, dim), torch.randn(blocks, page, heads, dim)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reference.store_kv(k, v, expected_k, expected_v, slots)
    store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)
