import pytest
import torch

from deltaserve.kernels.gdn import reference
from deltaserve.kernels.gdn.triton_chunk import chunk_gdn, split_at_captures
from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


def _inputs(tokens, hk, hv, dk, dv, slots):
    # q/k/v come sliced out of one projection in the model: pass strided views.
    packed = torch.randn(tokens, 2 * hk * dk + hv * dv + 2 * hv)
    q, k, v, a, b = packed.split([hk * dk, hk * dk, hv * dv, hv, hv], -1)
    A_log, dt_bias = torch.randn(hv) * 0.5, torch.randn(hv)
    h_pool = torch.randn(slots, hv, dk, dv) * 0.3
    return (q.reshape(tokens, hk, dk), k.reshape(tokens, hk, dk), v.reshape(tokens, hv, dv), a, b, A_log, dt_bias,
            h_pool)


@pytest.mark.parametrize("hk,hv,dk,dv,block_v", [(2, 4, 16, 24, None), (1, 3, 12, 16, 8), (2, 2, 16, 16, 16)])
def test_recurrent_decode_matches_reference(hk, hv, dk, dv, block_v):
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(3, hk, hv, dk, dv, slots=5)
    slots = torch.tensor([3, 0, 4])
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    expected = reference.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, expected_pool, slots)
    out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, pool, slots, block_v=block_v)
    assert_close(out, expected)
    assert_close(pool, expected_pool)
    assert torch.equal(pool[[1, 2]], h_pool[[1, 2]])  # untouched slots


def test_recurrent_decode_skips_padding_slot():
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(2, 1, 2, 8, 8, slots=3)
    pool = h_pool.clone()
    out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, pool, torch.tensor([1, -1]))
    expected_pool = h_pool.clone()
    expected = reference.recurrent_gated_delta_rule(q[:1], k[:1], v[:1], a[:1], b[:1], A_log, dt_bias,
                                                    expected_pool, torch.tensor([1]))
    assert_close(out[:1], expected)
    assert_close(pool, expected_pool)
    assert torch.equal(pool[[0, 2]], h_pool[[0, 2]])  # the padding row wrote no state


def test_ragged_prefill_with_captures_matches_chunk_reference():
    lens = [1, 9, 0, 5]
    starts = torch.tensor([0] + lens).cumsum(0)
    tokens = sum(lens)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(tokens, 2, 4, 16, 24, slots=6)
    slots = torch.tensor([4, 0, 5, 2])
    captures = [(0, 0), (3, 1), (9, 2), (12, 3)]  # first row, mid-sequence, a sequence's last row
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    expected_snaps, snaps = torch.zeros(4, 4, 16, 24), torch.zeros(4, 4, 16, 24)
    expected = reference.chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, expected_pool, slots, starts,
                                                captures, expected_snaps)
    out = chunk_gdn(q, k, v, a, b, A_log, dt_bias, pool, slots, starts, captures, snaps)
    assert_close(out, expected)
    assert_close(pool, expected_pool)
    assert_close(snaps, expected_snaps)


def test_split_at_captures_cuts_after_each_capture_row():
    starts, slots = [0, 1, 10, 10, 15], [4, 0, 5, 2]
    rounds = split_at_captures(starts, slots, [(0, 7), (3, 8), (9, 9), (12, 10), (5, 11)])
    assert rounds[0] == [(4, 0, 1, [7]), (0, 1, 4, [8]), (5, 10, 10, []), (2, 10, 13, [10])]
    assert rounds[1] == [(0, 4, 6, [11]), (2, 13, 15, [])]
    assert rounds[2] == [(0, 6, 10, [9])]
