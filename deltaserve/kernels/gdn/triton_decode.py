"""A GDN layer's decode step on the GPU: one fused launch below FUSED_MAX_BATCH sequences, the three
kernels it fuses from there.

The fused kernel (triton_decode_fused.py) holds a value head's whole [Dk, Dv] state in one program,
which the gated norm needs. Measured on the H200 at the Qwen3.5 shape, fp32 state, as a graph of
calls (kernels_check_gdn_decode_fused.json): it takes 5.2 / 9.6 / 17.4 us at 1 / 8 / 16 sequences
where the conv, the delta rule on its default tiles and the gated norm take 5.6 / 12.7 / 19.8; from
32 sequences on the three keep pace (44.8 / 84.6 / 160.7 us at 32 / 64 / 128 against 46.0 / 85.3 /
160.7): there the state's traffic sets the time, and the delta rule reads it faster on half-row tiles
of four programs a multiprocessor than the fused kernel on full rows of two (254 registers a thread).
"""

import torch

from deltaserve.kernels.conv1d.triton_causal_conv1d import causal_conv1d
from deltaserve.kernels.gdn.triton_decode_fused import gdn_decode_fused
from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent
from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm

FUSED_MAX_BATCH = 31


def gdn_decode(mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, eps: float,
               state_slots, seq_lens) -> torch.Tensor:
    """Same contract as decode_reference.gdn_decode."""
    batch = mixed.shape[0]
    if batch <= FUSED_MAX_BATCH:
        return gdn_decode_fused(mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, eps,
                                state_slots, seq_lens)
    hv, dk, dv = h_pool.shape[1:]
    hk = (mixed.shape[1] - hv * dv) // (2 * dk)
    x = causal_conv1d(mixed, conv_weight, conv_state, state_slots, None, seq_lens)
    q, k, v = x.split([hk * dk, hk * dk, hv * dv], -1)
    o = gdn_recurrent(q.reshape(batch, hk, dk), k.reshape(batch, hk, dk), v.reshape(batch, hv, dv), a, b, A_log,
                      dt_bias, h_pool, state_slots)
    return gated_rms_norm(o, z.reshape(batch, hv, dv), norm_weight, eps).reshape(batch, hv * dv)
