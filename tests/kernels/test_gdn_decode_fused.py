"""The fused GDN decode step (conv update, gated delta rule, gated norm) against its reference, which is
the three unfused references composed."""

import pytest
import torch

from deltaserve.kernels.conv1d import reference as conv_ref
from deltaserve.kernels.gdn import reference as gdn_ref
from deltaserve.kernels.gdn.decode_fused_reference import gdn_decode_fused as reference
from deltaserve.kernels.gdn.triton_decode_fused import gdn_decode_fused
from deltaserve.kernels.norm import reference as norm_ref
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


def _inputs(batch, hk, hv, dk, dv, kernel, slots):
    conv_dim = 2 * hk * dk + hv * dv
    # the layer slices mixed, z, b, a out of one projection: pass strided views
    packed = torch.randn(batch, conv_dim + hv * dv + 2 * hv)
    mixed, z, b, a = packed.split([conv_dim, hv * dv, hv, hv], -1)
    return dict(
        mixed=mixed, z=z, a=a, b=b,
        conv_weight=torch.randn(conv_dim, kernel) * 0.5,
        conv_state=torch.randn(slots, conv_dim, kernel - 1),
        A_log=torch.randn(hv) * 0.5, dt_bias=torch.randn(hv),
        h_pool=torch.randn(slots, hv, dk, dv) * 0.3,
        norm_weight=torch.randn(dv),
        eps=1e-6,
    )


def _check(batch_slots, hk, hv, dk, dv, kernel, num_slots, **kwargs):
    args = _inputs(len(batch_slots), hk, hv, dk, dv, kernel, num_slots)
    spare = num_slots - 1  # the reference runs a padding row (slot -1) on this slot, zeroed
    assert spare not in batch_slots
    conv0, h0 = args["conv_state"].clone(), args["h_pool"].clone()
    expected_conv, expected_h = conv0.clone(), h0.clone()
    expected_conv[spare], expected_h[spare] = 0.0, 0.0
    ref_slots = torch.tensor([s if s >= 0 else spare for s in batch_slots])
    expected = reference(**dict(args, conv_state=expected_conv, h_pool=expected_h), state_slots=ref_slots)
    out = gdn_decode_fused(**args, state_slots=torch.tensor(batch_slots, dtype=torch.int32), **kwargs)
    assert out.shape == (len(batch_slots), hv * dv)
    # padding rows share the spare slot in the reference, so only a lone one is comparable there
    rows = slice(None) if batch_slots.count(-1) <= 1 else [i for i, s in enumerate(batch_slots) if s >= 0]
    assert_close(out[rows], expected[rows])
    live = [s for s in batch_slots if s >= 0]
    assert_close(args["conv_state"][live], expected_conv[live])
    assert_close(args["h_pool"][live], expected_h[live])
    untouched = [s for s in range(num_slots) if s not in live]
    assert torch.equal(args["conv_state"][untouched], conv0[untouched])
    assert torch.equal(args["h_pool"][untouched], h0[untouched])


# grouped value heads 1, 2, 3; Dk != Dv; dims that are not powers of two; kernel widths 4 and 3
@pytest.mark.parametrize("hk,hv,dk,dv,kernel", [
    (2, 2, 16, 16, 4),
    (2, 4, 16, 24, 4),
    (1, 3, 12, 16, 3),
    (2, 6, 8, 8, 4),
])
def test_decode_fused_matches_reference(hk, hv, dk, dv, kernel):
    _check([3, 0, 4], hk, hv, dk, dv, kernel, num_slots=6)


@pytest.mark.parametrize("batch_slots", [[2, -1, 0], [-1, 1, -1, 0]])
def test_decode_fused_padding_rows_compute_on_zero_state_and_write_none(batch_slots):
    _check(batch_slots, 2, 4, 16, 16, 4, num_slots=4, num_warps=2)


def test_reference_is_the_three_unfused_ops():
    hk, hv, dk, dv, kernel, batch = 2, 4, 8, 8, 4, 3
    args = _inputs(batch, hk, hv, dk, dv, kernel, slots=5)
    slots = torch.tensor([4, 1, 2])
    conv_state, h_pool = args["conv_state"].clone(), args["h_pool"].clone()
    fused = reference(**args, state_slots=slots)
    x = conv_ref.causal_conv1d(args["mixed"], args["conv_weight"], conv_state, slots, torch.arange(batch + 1))
    q, k, v = x.split([hk * dk, hk * dk, hv * dv], -1)
    o = gdn_ref.recurrent_gated_delta_rule(q.reshape(batch, hk, dk), k.reshape(batch, hk, dk),
                                           v.reshape(batch, hv, dv), args["a"], args["b"], args["A_log"],
                                           args["dt_bias"], h_pool, slots)
    unfused = norm_ref.gated_rms_norm(o, args["z"].reshape(batch, hv, dv), args["norm_weight"], args["eps"])
    assert torch.equal(fused, unfused.reshape(batch, hv * dv))
    assert torch.equal(conv_state, args["conv_state"]) and torch.equal(h_pool, args["h_pool"])
