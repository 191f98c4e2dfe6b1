"""Torch reference of the fused GDN decode step: the definition of `gdn_decode_fused`.

One token per sequence, composed of the ops the layer runs unfused: the causal conv1d update of the
q/k/v channels (+ SiLU), the recurrent gated delta rule (q/k L2 norm, gating, grouped value heads)
on the fp32 state in `h_pool[slot]`, and the gated RMSNorm of each head's output with z.
"""

import torch

from deltaserve.kernels.conv1d.reference import causal_conv1d
from deltaserve.kernels.gdn.reference import recurrent_gated_delta_rule
from deltaserve.kernels.norm.reference import gated_rms_norm


def decode_head_shape(conv_dim: int, h_pool: torch.Tensor) -> tuple[int, int, int, int]:
    """(Hk, Hv, Dk, Dv) from the conv width [q | k | v] and the state pool [S, Hv, Dk, Dv]."""
    hv, dk, dv = h_pool.shape[1:]
    key_size = (conv_dim - hv * dv) // 2
    return key_size // dk, hv, dk, dv


def gdn_decode_fused(mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, eps: float,
                     state_slots) -> torch.Tensor:
    """mixed [B, conv_dim] = [q | k | v] before the conv; z [B, Hv*Dv] (or [B, Hv, Dv]); a, b [B, Hv];
    conv_state [S, conv_dim, K-1] and h_pool [S, Hv, Dk, Dv] updated in place at state_slots [B].
    Returns the gated-normed output [B, Hv*Dv] in mixed's dtype."""
    batch = mixed.shape[0]
    hk, hv, dk, dv = decode_head_shape(mixed.shape[1], h_pool)
    one_row_each = torch.arange(batch + 1, device=mixed.device)
    mixed = causal_conv1d(mixed, conv_weight, conv_state, state_slots, one_row_each)
    q, k, v = mixed.split([hk * dk, hk * dk, hv * dv], -1)
    out = recurrent_gated_delta_rule(q.reshape(batch, hk, dk), k.reshape(batch, hk, dk), v.reshape(batch, hv, dv),
                                     a, b, A_log, dt_bias, h_pool, state_slots)
    out = gated_rms_norm(out, z.reshape(batch, hv, dv), norm_weight, eps)
    return out.reshape(batch, hv * dv)
