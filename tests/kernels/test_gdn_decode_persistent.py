import pytest
import torch

from deltaserve.kernels.gdn import reference
from deltaserve.kernels.gdn.triton_decode_persistent import gdn_decode_persistent
from tests.kernels.conftest import assert_close
from tests.kernels.test_gdn_kernels import _inputs

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("hk,hv,dk,dv,block_v,stages,programs_per_sm", [
    (2, 4, 16, 24, 16, 2, 1),  # Dv not a multiple of the tile: the last tile is masked
    (1, 3, 12, 16, 8, 3, 4),   # Dk not a power of two
    (2, 2, 16, 16, 16, 2, 8),  # more programs than tiles
    (1, 2, 40, 72, 64, 2, 1),
])
def test_persistent_decode_matches_reference(hk, hv, dk, dv, block_v, stages, programs_per_sm, monkeypatch):
    # The interpreter's device has the H200's 132 multiprocessors: one of them makes each program walk
    # several tiles, as the card's programs do at a large batch.
    monkeypatch.setattr("deltaserve.kernels.gdn.triton_decode_persistent.num_sms", lambda device: 1)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(3, hk, hv, dk, dv, slots=5)
    slots = torch.tensor([3, 0, 4])
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    expected = reference.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, expected_pool, slots)
    out = gdn_decode_persistent(q, k, v, a, b, A_log, dt_bias, pool, slots, block_v=block_v, stages=stages,
                                programs_per_sm=programs_per_sm)
    assert_close(out, expected)
    assert_close(pool, expected_pool)
    assert torch.equal(pool[[1, 2]], h_pool[[1, 2]])  # untouched slots


def test_persistent_decode_rounds_a_bfloat16_state_as_the_reference_does():
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(4, 2, 4, 16, 16, slots=6)
    h_pool = h_pool.to(torch.bfloat16)
    slots = torch.tensor([5, 1, 0, 3])
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    expected = reference.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, expected_pool, slots)
    out = gdn_decode_persistent(q, k, v, a, b, A_log, dt_bias, pool, slots, block_v=8)
    assert pool.dtype == torch.bfloat16
    assert_close(out, expected)
    assert_close(pool.float(), expected_pool.float(), tol=1e-2)


def test_persistent_decode_skips_a_padding_slot(monkeypatch):
    monkeypatch.setattr("deltaserve.kernels.gdn.triton_decode_persistent.num_sms", lambda device: 1)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(2, 1, 2, 8, 8, slots=3)
    pool = h_pool.clone()
    out = gdn_decode_persistent(q, k, v, a, b, A_log, dt_bias, pool, torch.tensor([-1, 1]), block_v=4,
                                programs_per_sm=1)
    expected_pool = h_pool.clone()
    expected = reference.recurrent_gated_delta_rule(q[1:], k[1:], v[1:], a[1:], b[1:], A_log, dt_bias,
                                                    expected_pool, torch.tensor([1]))
    assert_close(out[1:], expected)
    assert_close(pool, expected_pool)
    assert torch.equal(pool[[0, 2]], h_pool[[0, 2]])  # the padding row wrote no state
