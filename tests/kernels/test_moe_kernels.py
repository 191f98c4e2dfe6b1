import pytest
import torch

from deltaserve.kernels.moe import reference
from deltaserve.kernels.moe.triton_moe_experts import moe_experts
from deltaserve.kernels.moe.triton_moe_route import moe_route
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_top_k(renormalize):
    logits = torch.randn(5, 10)
    weights, ids = moe_route(logits, 3, renormalize)
    expected_weights, expected_ids = reference.moe_route(logits, 3, renormalize)
    assert torch.equal(ids, expected_ids)
    assert_close(weights, expected_weights)


# one token; decode blocks of 16 rows; a hot expert spanning two blocks of 16; prefill blocks of 64, two per expert
@pytest.mark.parametrize("tokens,experts,hot", [(1, 6, False), (7, 8, False), (20, 20, True), (100, 3, False)])
def test_grouped_experts(tokens, experts, hot):
    hidden, inter, top_k = 40, 24, 2
    x = torch.randn(tokens, hidden)
    w13 = torch.randn(experts, 2 * inter, hidden) * 0.2
    w2 = torch.randn(experts, hidden, inter) * 0.2
    logits = torch.randn(tokens, experts)
    if hot:
        logits[:, 3] += 10.0  # every token picks expert 3
    weights, ids = reference.moe_route(logits, top_k, True)
    assert_close(moe_experts(x, w13, w2, weights, ids), reference.moe_experts(x, w13, w2, weights, ids))


def test_align_pairs_blocks():
    from deltaserve.kernels.moe.triton_moe_experts import align_pairs

    ids = torch.tensor([[4, 0], [0, 2], [4, 0], [0, 4]])
    order, offsets, block_start, max_blocks = align_pairs(ids, 6, block_m=2)
    assert offsets.tolist() == [0, 4, 4, 5, 5, 8, 8]
    assert block_start.tolist() == [0, 2, 2, 3, 3, 5, 5]
    assert max_blocks >= 5
    assert torch.equal(ids.flatten()[order], ids.flatten().sort(stable=True).values)
