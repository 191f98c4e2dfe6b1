import pytest
import torch

from deltaserve.kernels.activation.reference import silu_and_mul
from deltaserve.kernels.moe import reference
from deltaserve.kernels.moe.triton_moe_direct import DirectTiles
from deltaserve.kernels.moe.triton_moe_experts import moe_experts
from deltaserve.kernels.moe.triton_moe_route import moe_route
from deltaserve.kernels.partial_sums import PartialSums, first_columns
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts,top_k", [(10, 3), (64, 8)])
def test_route_top_k(renormalize, experts, top_k):
    logits = torch.randn(5, experts)
    weights, ids = moe_route(logits, top_k, renormalize)
    expected_weights, expected_ids = reference.moe_route(logits, top_k, renormalize)
    assert torch.equal(ids, expected_ids)
    assert_close(weights, expected_weights)


def test_route_ties_go_to_the_lowest_expert():
    logits = torch.tensor([[0.5, 2.0, 0.5, 2.0, 0.5, -1.0]])
    weights, ids = moe_route(logits, 4, False)
    assert ids.tolist() == [[1, 3, 0, 2]]
    assert weights[0, 0] == weights[0, 1] and weights[0, 2] == weights[0, 3]


# no renormalisation; top-8 of 64 (a BLOCK_K of 16 slots); a strided row as the padded input GEMM gives it
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts,top_k,row", [(10, 3, 11), (64, 8, 72), (6, 1, 16)])
def test_route_with_shared_gate(renormalize, experts, top_k, row):
    projected = torch.randn(7, row) * 3
    logits = projected[:, : experts + 1]
    weights, ids = moe_route(logits, top_k, renormalize, shared_gate=True)
    expected_weights, expected_ids = reference.moe_route(logits, top_k, renormalize, shared_gate=True)
    assert ids.shape == (7, top_k + 1)
    assert torch.equal(ids, expected_ids)
    assert_close(weights, expected_weights)
    # The reference's meaning: the routed choices as without the gate, then expert E at sigmoid(gate).
    routed_weights, routed_ids = reference.moe_route(logits[:, :experts], top_k, renormalize)
    assert torch.equal(expected_ids[:, :top_k], routed_ids) and (expected_ids[:, top_k] == experts).all()
    assert torch.equal(expected_weights[:, :top_k], routed_weights)
    assert_close(expected_weights[:, top_k], torch.sigmoid(logits[:, experts]))


def _experts_inputs(tokens, experts, hidden, inter, top_k, hot=False):
    x = torch.randn(tokens, hidden)
    w13 = torch.randn(experts, 2 * inter, hidden) * 0.2
    w2 = torch.randn(experts, hidden, inter) * 0.2
    logits = torch.randn(tokens, experts)
    if hot:
        logits[:, 3] += 10.0  # every token picks expert 3
    weights, ids = reference.moe_route(logits, top_k, True)
    return x, w13, w2, weights, ids


# one token; tokens sharing experts; sizes off every block; more choices than the unroll step; loads
# run ahead by 1-3 steps
@pytest.mark.parametrize("tokens,experts,hidden,inter,top_k,tiles", [
    (1, 6, 40, 24, 2, DirectTiles()),
    (6, 4, 64, 32, 3, DirectTiles(16, 32, 4, 3, 16, 16, 4, 2, 2)),
    (3, 16, 33, 20, 5, DirectTiles(8, 16, 2, 1, 8, 16, 2, 4, 1)),
    (2, 8, 48, 40, 8, DirectTiles(32, 64, 4, 2, 16, 64, 4, 8, 3)),
])
def test_direct_experts(tokens, experts, hidden, inter, top_k, tiles):
    x, w13, w2, weights, ids = _experts_inputs(tokens, experts, hidden, inter, top_k, hot=tokens == 6)
    out = moe_experts(x, w13, w2, weights, ids, tiles=tiles, path="direct")
    assert_close(out, reference.moe_experts(x, w13, w2, weights, ids))
    again = moe_experts(x, w13, w2, weights, ids, tiles=tiles, path="direct")
    assert torch.equal(out, again)


# groups of choices: 9 choices in three groups of three, 5 in groups of 2, 2, 1; a group per choice
@pytest.mark.parametrize("top_k,groups", [(9, 3), (5, 3), (3, 4)])
def test_direct_experts_partial_sums_by_groups_of_choices(top_k, groups):
    tokens, experts = 3, 12
    x, w13, w2, weights, ids = _experts_inputs(tokens, experts, 40, 24, top_k)
    tiles = DirectTiles(16, 32, 4, 2, 16, 16, 4, 2, 2, groups)
    partial = moe_experts(x, w13, w2, weights, ids, tiles=tiles, path="direct", partial=True)
    group = -(-top_k // min(groups, top_k))
    assert partial.parts.shape == (-(-top_k // group), tokens, 40) and partial.dtype == x.dtype
    for g, part in enumerate(partial.parts):  # part g: the group's choices alone (the others unrouted)
        others = torch.ones(top_k, dtype=torch.bool)
        others[g * group:(g + 1) * group] = False
        alone = torch.where(others, experts, ids)
        assert_close(part, reference.moe_experts(x, w13, w2, weights, alone))
    assert_close(partial.total(), reference.moe_experts(x, w13, w2, weights, ids))


def test_direct_experts_stay_whole_above_the_partial_sums_tokens():
    from deltaserve.kernels.moe.triton_moe_direct import PARTIAL_MAX_TOKENS

    for tokens in (1, PARTIAL_MAX_TOKENS + 1):
        x, w13, w2, weights, ids = _experts_inputs(tokens, 6, 32, 16, 3)
        out = moe_experts(x, w13, w2, weights, ids, path="direct", partial=True)
        assert isinstance(out, PartialSums) == (tokens <= PARTIAL_MAX_TOKENS)
        assert_close(out.total() if isinstance(out, PartialSums) else out,
                     reference.moe_experts(x, w13, w2, weights, ids))


def test_route_sums_partial_logits():
    parts = torch.randn(4, 6, 72) * 2
    partial = first_columns(PartialSums(parts, torch.float32), 65)  # 64 router columns and the shared gate
    weights, ids = moe_route(partial, 8, True, shared_gate=True)
    expected_weights, expected_ids = reference.moe_route(partial.total(), 8, True, shared_gate=True)
    assert torch.equal(ids, expected_ids)
    assert_close(weights, expected_weights)


def test_direct_sum_order_does_not_depend_on_the_unroll_step():
    x, w13, w2, weights, ids = _experts_inputs(2, 8, 32, 16, 6)
    outs = [moe_experts(x, w13, w2, weights, ids, path="direct",
                        tiles=DirectTiles(16, 32, 4, 2, 16, 16, 4, unroll, 2)) for unroll in (1, 4, 6)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_default_path_is_direct_for_decode_batches(monkeypatch):
    from deltaserve.kernels.moe import triton_moe_experts

    taken = []
    monkeypatch.setattr(triton_moe_experts, "moe_experts_direct", lambda *a: taken.append("direct"))
    monkeypatch.setattr(triton_moe_experts, "moe_experts_sorted", lambda *a: taken.append("sorted"))
    small, large = torch.zeros(4, 8, dtype=torch.long), torch.zeros(40, 8, dtype=torch.long)
    moe_experts(None, None, None, None, small)
    moe_experts(None, None, None, None, large)
    assert taken == ["direct", "sorted"]


# one token; decode blocks of 16 rows; a hot expert spanning two blocks of 16; prefill blocks of 64, two per expert
@pytest.mark.parametrize("tokens,experts,hot", [(1, 6, False), (7, 8, False), (20, 20, True), (100, 3, False)])
def test_grouped_experts(tokens, experts, hot):
    x, w13, w2, weights, ids = _experts_inputs(tokens, experts, 40, 24, 2, hot)
    out = moe_experts(x, w13, w2, weights, ids, path="sorted")
    assert_close(out, reference.moe_experts(x, w13, w2, weights, ids))


@pytest.mark.parametrize("columns_fast", [False, True])
def test_grouped_experts_in_either_grid_order(columns_fast):
    x, w13, w2, weights, ids = _experts_inputs(70, 5, 40, 24, 2, True)
    out = moe_experts(x, w13, w2, weights, ids, tiles=(16, 16, 16, 16, 16, 4, 1, columns_fast), path="sorted")
    assert_close(out, reference.moe_experts(x, w13, w2, weights, ids))


@pytest.mark.parametrize("columns_fast", [False, True])
def test_grouped_experts_through_tma_descriptors(columns_fast):
    """Weights (and the down kernel's rows) through descriptors: K steps past the hidden and intermediate
    columns read zeros, a block's box reaches into the next expert's rows; the same bytes as the loads."""
    x, w13, w2, weights, ids = _experts_inputs(70, 5, 80, 48, 2, True)
    tiles = (16, 32, 16, 32, 16, 4, 1, columns_fast)
    out = moe_experts(x, w13, w2, weights, ids, tiles=(*tiles, 0, 0, True), path="sorted")
    assert_close(out, reference.moe_experts(x, w13, w2, weights, ids))
    assert torch.equal(out, moe_experts(x, w13, w2, weights, ids, tiles=tiles, path="sorted"))


def test_tma_tiles_that_would_cross_experts_take_the_loads():
    from deltaserve.kernels.moe.triton_moe_experts import _tma_fits

    x, w13, w2, weights, ids = _experts_inputs(30, 4, 80, 40, 2, False)
    assert _tma_fits(w13, w2, 8, 16) and not _tma_fits(w13, w2, 16, 16) and not _tma_fits(w13, w2, 8, 32)
    assert not _tma_fits(w13[::2], w2, 8, 16)  # one expert's rows not right after the previous one's
    out = moe_experts(x, w13, w2, weights, ids, tiles=(16, 32, 32, 32, 16, 4, 1, False, 0, 0, True), path="sorted")
    assert_close(out, reference.moe_experts(x, w13, w2, weights, ids))


def _assert_stably_sorted_in_blocks(ids, experts, block_m, order, offsets, block_start):
    """order as torch's stable sort; offsets and block_start [E + 1] over the routed pairs (id < experts)."""
    assert torch.equal(order, ids.sort(stable=True).indices)
    counts = torch.bincount(ids, minlength=experts + 1)[:experts]
    assert offsets.tolist() == [0] + counts.cumsum(0).tolist()
    blocks = (counts + block_m - 1) // block_m
    assert block_start.tolist() == [0] + blocks.cumsum(0).tolist()
    return blocks.sum().item()


# Up to COUNTING_SORT_MAX_PAIRS (4096) pairs the one-launch counting sort; past it the block-wise one:
# just past (4097), partial last blocks, unrouted pairs (id = experts), 3 experts (many ties) and the
# 35B-A3B's 257 experts x 9 choices.
@pytest.mark.parametrize("tokens,choices,experts,block_m,unrouted", [
    (1, 1, 9, 16, False), (63, 1, 9, 16, False), (64, 1, 9, 4, False), (300, 1, 9, 16, False),
    (100, 9, 257, 16, True), (4100, 1, 9, 64, False), (4097, 1, 9, 16, True), (1000, 5, 3, 16, True),
    (911, 9, 257, 16, True), (456, 9, 257, 64, False)])
def test_align_pairs_sorts_stably_and_lays_out_blocks(tokens, choices, experts, block_m, unrouted):
    from deltaserve.kernels.moe.triton_moe_experts import align_pairs

    # Without unrouted pairs the last expert gets none either.
    ids = torch.randint(0, experts + 1 if unrouted else experts - 1, (tokens, choices))
    order, offsets, block_start, max_blocks = align_pairs(ids, experts, block_m)
    blocks = _assert_stably_sorted_in_blocks(ids.flatten(), experts, block_m, order, offsets, block_start)
    assert max_blocks >= blocks


# The block-wise sort at small blocks: several blocks of several tiles, a partial last block or tile,
# one partial block, ids as int32.
@pytest.mark.parametrize("pairs,experts,block,tile,dtype", [
    (100, 4, 16, 4, torch.int64), (97, 20, 16, 8, torch.int32), (5, 4, 16, 16, torch.int64),
    (64, 3, 16, 16, torch.int64)])
def test_block_counting_sort_across_blocks_and_tiles(pairs, experts, block, tile, dtype):
    from deltaserve.kernels.moe.triton_moe_experts import _block_counting_sort

    ids = torch.randint(0, experts + 1, (pairs,), dtype=dtype)  # some unrouted
    order, offsets, block_start = _block_counting_sort(ids, experts, 4, block, tile)
    _assert_stably_sorted_in_blocks(ids.long(), experts, 4, order, offsets, block_start)


def test_align_pairs_blocks():
    from deltaserve.kernels.moe.triton_moe_experts import align_pairs

    ids = torch.tensor([[4, 0], [0, 2], [4, 0], [0, 4]])
    order, offsets, block_start, max_blocks = align_pairs(ids, 6, block_m=2)
    assert offsets.tolist() == [0, 4, 4, 5, 5, 8, 8]
    assert block_start.tolist() == [0, 2, 2, 3, 3, 5, 5]
    assert max_blocks >= 5
    assert torch.equal(ids.flatten()[order], ids.flatten().sort(stable=True).values)


def _shared_experts_inputs(tokens, experts, hidden, inter, top_k):
    """Routed experts with the shared expert stacked as expert E, routed by a gate column."""
    x = torch.randn(tokens, hidden)
    w13 = torch.randn(experts + 1, 2 * inter, hidden) * 0.2
    w2 = torch.randn(experts + 1, hidden, inter) * 0.2
    logits = torch.randn(tokens, experts + 1)
    weights, ids = reference.moe_route(logits, top_k, True, shared_gate=True)
    return x, w13, w2, weights, ids, logits[:, experts:]


# decode sizes (direct); the sorted path with its small, medium and large tiles
@pytest.mark.parametrize("tokens,experts,path", [(1, 6, "direct"), (5, 6, "direct"), (3, 6, "sorted"),
                                                 (60, 6, "sorted"), (150, 2, "sorted")])
def test_experts_run_the_stacked_shared_expert(tokens, experts, path):
    hidden, inter, top_k = 40, 24, 2
    x, w13, w2, weights, ids, gate = _shared_experts_inputs(tokens, experts, hidden, inter, top_k)
    out = moe_experts(x, w13, w2, weights, ids, path=path)
    assert_close(out, reference.moe_experts(x, w13, w2, weights, ids))
    # The same as the routed experts plus the sigmoid-gated shared MLP computed on its own.
    routed = reference.moe_experts(x, w13[:experts], w2[:experts], weights[:, :top_k], ids[:, :top_k])
    shared = silu_and_mul(x @ w13[experts].T) @ w2[experts].T
    assert_close(out, routed + torch.sigmoid(gate) * shared)


def test_sorted_tiles_by_pairs_per_expert():
    from deltaserve.kernels.moe.triton_moe_experts import LARGE_TILES, MEDIUM_TILES, SMALL_TILES, default_tiles

    experts = 257  # 256 routed and a stacked shared expert
    assert default_tiles(32 * 9, experts) == SMALL_TILES
    assert default_tiles(96 * 9, experts) == SMALL_TILES  # a prefix-cache hit's tail in a 96-row graph
    assert default_tiles(128 * 9, experts) == SMALL_TILES  # a 128-sequence decode step
    assert default_tiles(160 * 9, experts) == MEDIUM_TILES
    assert default_tiles(2048 * 9, experts) == MEDIUM_TILES
    assert default_tiles(8192 * 9, experts) == LARGE_TILES


# A graph's padding rows (at or after live_rows) route to no expert: their choices get the id past the
# stacked experts and weight 0, the experts skip them, and their output rows are zero. The live rows
# come out as they do without padding.
@pytest.mark.parametrize("shared_gate", [False, True])
def test_route_leaves_rows_past_live_rows_unrouted(shared_gate):
    experts, top_k, tokens, live = 12, 3, 7, 4
    logits = torch.randn(tokens, experts + int(shared_gate))
    live_rows = torch.tensor([live])
    weights, ids = moe_route(logits, top_k, True, shared_gate, live_rows=live_rows)
    expected_weights, expected_ids = reference.moe_route(logits, top_k, True, shared_gate, live_rows)
    assert torch.equal(ids, expected_ids)
    assert_close(weights, expected_weights)
    plain_weights, plain_ids = moe_route(logits, top_k, True, shared_gate)
    assert torch.equal(ids[:live], plain_ids[:live]) and torch.equal(weights[:live], plain_weights[:live])
    assert (ids[live:] == experts + int(shared_gate)).all() and (weights[live:] == 0).all()


@pytest.mark.parametrize("tokens,path", [(3, "direct"), (9, "direct"), (40, "sorted"), (150, "sorted")])
def test_experts_skip_unrouted_rows(tokens, path):
    experts, hidden, inter, top_k = 6, 40, 24, 2
    x, w13, w2, weights, ids, _ = _shared_experts_inputs(tokens, experts, hidden, inter, top_k)
    live = tokens - tokens // 3 - 1
    unrouted_ids = ids.clone()
    unrouted_ids[live:] = experts + 1
    unrouted_weights = weights.clone()
    unrouted_weights[live:] = 0.0
    out = moe_experts(x, w13, w2, unrouted_weights, unrouted_ids, path=path)
    assert (out[live:] == 0).all()
    assert_close(out[:live], moe_experts(x[:live], w13, w2, weights[:live], ids[:live], path=path))
    expected = reference.moe_experts(x, w13, w2, unrouted_weights, unrouted_ids)
    assert (expected[live:] == 0).all()
    assert_close(out, expected)
