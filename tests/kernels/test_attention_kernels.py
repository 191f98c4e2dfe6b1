import random

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


def test_paged_attention_short_chunks_over_a_long_cached_prefix():
    # A prefix-cache hit's tail beside a graph's padding sequence: few programs, many rows, 128-row tiles.
    seq_lens, q_lens = [300, 9], [37, 9]
    k_cache, v_cache, tables = _paged_pools(seq_lens, 16, 1, 32)
    starts = torch.tensor([0] + q_lens).cumsum(0)
    q = torch.randn(sum(q_lens), 4, 32)
    lens = torch.tensor(seq_lens)
    expected = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.2)
    assert_close(paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.2), expected)


def test_paged_attention_sized_by_the_longest_chunk_matches_the_bound():
    # Many prompts prefilled together: the grid sized by the longest chunk (the host knows it outside a
    # graph) instead of the bound T - B + 1 leaves out only empty programs, so every row is the same.
    q_lens = torch.randint(1, 20, (9,)).tolist()
    k_cache, v_cache, tables = _paged_pools(q_lens, 4, 2, 16)
    starts, lens = torch.tensor([0] + q_lens).cumsum(0), torch.tensor(q_lens)
    q = torch.randn(sum(q_lens), 4, 16)
    expected = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3)
    sized = paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3, max_query_len=max(q_lens))
    assert_close(sized, expected)
    assert torch.equal(sized, paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3))


def test_paged_attention_of_a_graphs_pass_that_fills_its_rows_beside_an_empty_padding_sequence():
    # The bound T - B + 1 assumes a row in every sequence; a prefill graph passes its rung instead.
    rows = int(torch.randint(2, 40, ()))
    seq_lens = [rows, 0]
    k_cache, v_cache, tables = _paged_pools(seq_lens, 4, 2, 16)
    starts, lens = torch.tensor([0, rows, rows]), torch.tensor(seq_lens)
    q = torch.randn(rows, 8, 16)
    expected = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3)
    for block_m in (None, 16, 64):
        out = paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3, block_m=block_m, max_query_len=rows)
        assert_close(out, expected)


@pytest.mark.parametrize("block_m,block_n,splits,q_heads,kv_heads", [(64, 16, 1, 8, 2), (128, 16, 1, 9, 3),
                                                                   (64, 32, 3, 4, 1)])
def test_tall_tiles_walk_their_interior_keys_unmasked_to_the_same_bits(block_m, block_n, splits, q_heads, kv_heads):
    # A tile's unmasked interior ends at its first row's position, the masked walk takes the rest: chunks over
    # cached prefixes of every length modulo the key tile (where an interior one key too long or short would
    # show), a fresh prompt and a decode row; GQA groups of 4 and of 3 (whose tiles start inside a token's rows).
    # Keys split over one KV head: the interpreter runs the merge once per token and head, and this case took
    # 50 s at two (the output-gate test splits keys over two heads).
    # every residue of the key tile at 16; at 32, its edges and a fresh draw of eight others (each sequence costs
    # the interpreter a second)
    residues = range(block_n) if block_n <= 16 else sorted({0, 1, block_n - 1, *random.sample(range(2, block_n - 1), 8)})
    cached = [r + block_n * int(torch.randint(0, 3, ())) for r in residues]
    q_lens = torch.randint(1, 40, (len(cached),)).tolist() + [int(torch.randint(40, 120, ())), 1]
    seq_lens = [c + n for c, n in zip(cached, q_lens)] + [q_lens[-2], 77]
    k_cache, v_cache, tables = _paged_pools(seq_lens, 4, kv_heads, 16)
    starts, lens = torch.tensor([0] + q_lens).cumsum(0), torch.tensor(seq_lens)
    q = torch.randn(sum(q_lens), q_heads, 16)
    expected = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3)
    tiles = dict(block_m=block_m, block_n=block_n, splits=splits, max_query_len=max(q_lens))
    walked = paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3, interior=True, **tiles)
    assert_close(walked, expected)
    assert torch.equal(walked, paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3, interior=False, **tiles))


@pytest.mark.parametrize("splits", [1, 3])
def test_paged_attention_applies_the_output_gate_in_its_last_store(splits):
    # Qwen3.5's gate: the second half of each head's q projection, a strided view like q itself.
    seq_lens, q_lens = [21, 6], [5, 6]
    k_cache, v_cache, tables = _paged_pools(seq_lens, 4, 2, 16)
    starts, lens = torch.tensor([0] + q_lens).cumsum(0), torch.tensor(seq_lens)
    q, gate = torch.randn(sum(q_lens), 4, 2 * 16).chunk(2, dim=-1)
    expected = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3, gate)
    ungated = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3)
    assert torch.allclose(expected, ungated * torch.sigmoid(gate))
    assert_close(paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.3, splits=splits, gate=gate), expected)


@pytest.mark.parametrize("heads,head_dim,dtype", [(4, 16, torch.float32), (3, 24, torch.bfloat16),
                                                  (20, 256, torch.bfloat16)])
def test_output_gate_reads_strided_views_and_writes_contiguous_rows(heads, head_dim, dtype):
    from deltaserve.kernels.attention.triton_output_gate import output_gate

    tokens = 37
    out = torch.randn(heads, tokens, head_dim, dtype=dtype).transpose(0, 1)  # sdpa's output through a transpose
    _, gate = torch.randn(tokens, heads, 2 * head_dim, dtype=dtype).chunk(2, dim=-1)  # sliced out of q_proj's
    got = output_gate(out, gate)
    assert got.is_contiguous() and got.shape == (tokens, heads, head_dim) and got.dtype == dtype
    assert_close(got, reference.output_gate(out, gate), tol=1e-2 if dtype == torch.bfloat16 else 1e-5)
    assert_close(reference.output_gate(out, gate), out.float() * torch.sigmoid(gate.float()), tol=1e-2)


@pytest.mark.parametrize("splits", [None, 1, 2, 3, 8, 11, 32])
def test_paged_attention_decode_batch(splits):
    seq_lens = [3, 17, 9, 40]  # with 8 splits of whole 16-key tiles, some splits get no keys
    k_cache, v_cache, tables = _paged_pools(seq_lens, 8, 2, 16)
    q = torch.randn(4, 8, 16)
    starts, lens = torch.arange(5), torch.tensor(seq_lens)
    expected = reference.paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.25)
    out = paged_attention(q, k_cache, v_cache, starts, lens, tables, 0.25, block_n=16, splits=splits)
    assert_close(out, expected)


@pytest.mark.parametrize("sms", [132, 78, 170])
def test_single_tile_rows_split_their_keys_up_to_about_four_programs_an_sm(sms):
    from deltaserve.kernels.attention.triton_paged_attention import key_splits

    for programs in range(128, 8 * sms):
        splits = key_splits(programs, 16, sms)
        assert splits & (splits - 1) == 0  # a power of two: the merge kernel's rows are compiled per power
        assert programs * splits <= max(4 * sms, programs) < 2 * programs * splits
        assert key_splits(programs, 64, sms) == 1  # taller tiles: as many programs as fill the SMs, unsplit
    assert [key_splits(p, 16, sms) for p in (1, 16, 100)] == [16, 16, 4]  # few programs: about 256 in all


def test_decode_that_fills_the_sms_once_takes_wider_key_tiles_rather_than_two_splits():
    from deltaserve.kernels.attention.triton_paged_attention import launch_plan

    for seqs, kv_heads in ((48, 4), (64, 4), (128, 2)):  # 192 to 256 programs on 132 SMs
        plan = launch_plan(seqs, seqs, 1, 16 // kv_heads, kv_heads, 256, sms=132)
        assert (plan.block_m, plan.block_n, plan.splits) == (16, 64, 1)
    assert launch_plan(64, 64, 1, 4, 4, 128, sms=132).splits == 2  # smaller heads (64-key tiles already): two splits
    assert launch_plan(32, 32, 1, 4, 4, 256, sms=132).splits == 4
    assert launch_plan(128, 128, 1, 4, 4, 256, sms=132).block_n == 32  # one program a (sequence, KV head)


def test_long_prefill_chunks_take_tall_tiles_and_from_1024_tokens_walk_their_interior():
    from deltaserve.kernels.attention.triton_paged_attention import INTERIOR_TOKENS, LONG_ROWS, launch_plan

    for group, kv_heads in ((4, 4), (8, 2)):  # Qwen3.5-9B's and 35B-A3B's attention, head dim 256
        longest = int(torch.randint(INTERIOR_TOKENS, 2049, ()))
        plan = launch_plan(longest + 1, 2, longest, group, kv_heads, 256, sms=132)  # a prefill graph's pass
        assert (plan.block_m, plan.block_n, plan.splits, plan.interior) == (128, 64, 1, True)
        assert plan.tiles == -(-longest * group // 128)
        short = LONG_ROWS // group  # many prompts of this length: tall tiles, every key tile masked
        for length in (short, INTERIOR_TOKENS - 1):
            plan = launch_plan(128 * length, 128, length, group, kv_heads, 256, sms=132)
            assert (plan.block_m, plan.block_n, plan.splits, plan.interior) == (128, 64, 1, False)
        plan = launch_plan(128 * (short - 1), 128, short - 1, group, kv_heads, 256, sms=132)
        assert (plan.block_m, plan.interior) == (64, False)
        plan = launch_plan(96, 2, 80, group, kv_heads, 256, sms=132)  # a prefix-cache hit's tail: split, masked
        assert plan.block_m == 128 and plan.splits > 1 and not plan.interior


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


# partial rotary with a per-head norm (Qwen3.5), full rotary without one (Llama), one token (decode);
# tiles of 4 tokens (a long pass's), the last one partial
@pytest.mark.parametrize("tokens,q_heads,kv_heads,head_dim,rotary_dim,norm,block_t", [
    (5, 4, 2, 32, 8, True, None),
    (3, 3, 1, 16, 16, False, None),
    (1, 8, 2, 64, 16, True, None),
    (10, 4, 2, 32, 8, True, 4),
    (7, 3, 1, 16, 16, False, 4),
])
def test_rotary_store_kv_matches_the_unfused_ops(tokens, q_heads, kv_heads, head_dim, rotary_dim, norm, block_t):
    from deltaserve.kernels.attention.triton_rotary_store_kv import rotary_store_kv

    # q with its output gate interleaved per head, k and v: views into one fused projection
    packed = torch.randn(tokens, q_heads * 2 * head_dim + 2 * kv_heads * head_dim)
    q_gate, k, v = packed.split([q_heads * 2 * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    q = q_gate.view(tokens, q_heads, 2 * head_dim)[..., :head_dim]
    k, v = k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 50, (tokens,))
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(50).float()[:, None] * inv[None]
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1)
    page = 4
    k_cache, v_cache = torch.zeros(6, page, kv_heads, head_dim), torch.zeros(6, page, kv_heads, head_dim)
    slots = torch.randperm(6 * page)[:tokens]
    if tokens > 1:
        slots[1] = -1  # a padding row: nothing stored
    weights = dict(q_norm=torch.randn(head_dim), k_norm=torch.randn(head_dim), eps=1e-6, norm_offset=1.0) if norm else {}
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_q = reference.rotary_store_kv(q, k, v, positions, cos_sin, expected_k, expected_v, slots, **weights)
    out_q = rotary_store_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots, **weights, block_t=block_t)
    assert_close(out_q, expected_q)
    assert_close(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)
    if block_t:  # the same bytes as a token a program
        one_k, one_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        assert torch.equal(out_q, rotary_store_kv(q, k, v, positions, cos_sin, one_k, one_v, slots, **weights))
        assert torch.equal(k_cache, one_k) and torch.equal(v_cache, one_v)


@pytest.mark.parametrize("norm,block_t", [(True, None), (False, None), (True, 4)])
def test_rotary_store_kv_also_returns_the_rotated_k_rows(norm, block_t):
    # The fresh-prefill path attends over its own k rows: every row of k comes back rotated (padding too),
    # and the cache holds the same rows.
    from deltaserve.kernels.attention.triton_rotary_store_kv import rotary_store_kv

    tokens, q_heads, kv_heads, head_dim, rotary_dim, page = 9, 4, 2, 32, 16, 4
    q, k, v = torch.randn(tokens, q_heads, head_dim), torch.randn(tokens, kv_heads, head_dim), torch.randn(
        tokens, kv_heads, head_dim)
    positions = torch.arange(tokens)
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(tokens).float()[:, None] * inv[None]
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1)
    slots = torch.randperm(4 * page)[:tokens]
    slots[3] = -1
    weights = dict(q_norm=torch.randn(head_dim), k_norm=torch.randn(head_dim), eps=1e-6, norm_offset=1.0) if norm else {}
    k_cache, v_cache = torch.zeros(4, page, kv_heads, head_dim), torch.zeros(4, page, kv_heads, head_dim)
    expected_k_cache = k_cache.clone()
    expected_q, expected_k = reference.rotary_store_kv(q, k, v, positions, cos_sin, expected_k_cache, v_cache.clone(),
                                                       slots, **weights, k_out=True)
    out_q, out_k = rotary_store_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots, **weights, k_out=True,
                                   block_t=block_t)
    assert out_k.shape == k.shape and out_k.is_contiguous()
    assert_close(out_q, expected_q)
    assert_close(out_k, expected_k)
    assert_close(k_cache, expected_k_cache)
    live = slots >= 0
    stored = k_cache.reshape(-1, kv_heads, head_dim)[slots[live]]
    assert torch.equal(stored, out_k[live])  # the cache and the returned rows are the same rows


@pytest.mark.parametrize("tokens,block_t,norm", [(11, None, True), (13, 4, False), (6, None, False)])
def test_rotary_store_kv_with_q_of_some_rows(tokens, block_t, norm):
    # A pass that attends for a few rows only (its last layer) projects q for those rows: each is rotated at
    # its own row's position, while every row's k and v is stored as without q_rows.
    from deltaserve.kernels.attention.triton_rotary_store_kv import rotary_store_kv

    q_heads, kv_heads, head_dim, rotary_dim, page = 4, 2, 32, 16, 4
    q_all = torch.randn(tokens, q_heads, head_dim)
    k, v = torch.randn(tokens, kv_heads, head_dim), torch.randn(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 40, (tokens,))
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(40).float()[:, None] * inv[None]
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1)
    slots = torch.randperm(4 * page)[:tokens]
    weights = dict(q_norm=torch.randn(head_dim), k_norm=torch.randn(head_dim), eps=1e-6, norm_offset=1.0) if norm else {}
    rows = torch.randperm(tokens)[:torch.randint(0, 4, ()).item()].sort().values
    rows[-1:] = tokens - 1  # the last row, as a pass's last chunk samples it (none where rows is empty)
    every_k, every_v = torch.zeros(4, page, kv_heads, head_dim), torch.zeros(4, page, kv_heads, head_dim)
    every_q = reference.rotary_store_kv(q_all, k, v, positions, cos_sin, every_k, every_v, slots, **weights)
    q = q_all[rows]
    expected_k, expected_v = torch.zeros_like(every_k), torch.zeros_like(every_v)
    expected_q = reference.rotary_store_kv(q, k, v, positions, cos_sin, expected_k, expected_v, slots, **weights,
                                           q_rows=rows)
    assert torch.equal(expected_q, every_q[rows]) and torch.equal(expected_k, every_k)
    k_cache, v_cache = torch.zeros_like(every_k), torch.zeros_like(every_v)
    out_q = rotary_store_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots, **weights, block_t=block_t,
                            q_rows=rows)
    assert out_q.shape == q.shape
    assert_close(out_q, expected_q)
    assert_close(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)
