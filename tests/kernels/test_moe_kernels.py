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


@pytest.mark.parametrize("tokens", [1, 7])
def test_grouped_experts(tokens):
    experts, hidden, inter, top_k = 6, 40, 24, 3
    x = torch.randn(tokens, hidden)
    w13 = torch.randn(experts, 2 * inter, hidden) * 0.2
    w2 = torch.randn(experts, hidden, inter) * 0.2
    weights, ids = reference.moe_route(torch.randn(tokens, experts), top_k, True)
    assert_close(moe_experts(x, w13, w2, weights, ids), reference.moe_experts(x, w13, w2, weights, ids))
