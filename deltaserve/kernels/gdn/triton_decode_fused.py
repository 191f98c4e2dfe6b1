"""The whole GDN decode step of one layer in one launch: the conv1d update + SiLU of q/k/v, q/k L2
norm, gating, the gated delta rule on the state in place, and the gated RMSNorm of the output.

One program per (sequence, value head) holds that head's whole [Dk, Dv] state: the gated norm needs
the head's full row of Dv outputs. It convolves the q and k channels of its key head and the v
channels of its value head. The conv state is a ring (conv1d/reference.py): the token at position p
writes its inputs into column p % K, which no tap of that token reads, so the programs of a key
head's value heads all read the q/k channels' old inputs while the first of them writes the new
ones, with no order between them. (A program per key head, walking its value heads in turn so that
each conv channel had one reader and writer, measured slower than the three unfused launches from
batch 16 up: half the programs, each with its heads' states one after the other.)

A negative slot marks a padding row: it computes on zero states and writes none. Graph-safe: the
grid depends on shapes only and nothing syncs with the host.
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid


@triton.jit
def _conv_token(x_row, weight, ring, channels, mask_c, live, position, write, stride_w, stride_ring,
                K: tl.constexpr, BLOCK_K: tl.constexpr):
    """silu(causal conv) of the token at `position` on `channels`, fp32; stores its input into the
    ring's column position % K where `write` (and live). The old inputs come as a [taps, channels]
    tile summed over its taps: as one vector per tap, the sm_90 compile held 251 registers a thread
    at 8 warps against 127 (the layout the state's arithmetic wants made every lane compute its
    rows' conv), and a [channels, taps] tile moved the state's arithmetic into the tile's layout."""
    taps = tl.arange(0, BLOCK_K)  # tap j < K-1 multiplies the old input at position - (K-1) + j
    old = taps < K - 1
    columns = (position - (K - 1) + taps + K) % K
    w_old = tl.load(weight + channels[None, :] * stride_w + taps[:, None], mask=old[:, None] & mask_c[None, :],
                    other=0.0).to(tl.float32)
    inputs = tl.load(ring + channels[None, :] * stride_ring + columns[:, None],
                     mask=old[:, None] & (mask_c & live)[None, :], other=0.0).to(tl.float32)
    xt = tl.load(x_row + channels, mask=mask_c, other=0.0)
    w_new = tl.load(weight + channels * stride_w + (K - 1), mask=mask_c, other=0.0).to(tl.float32)
    tl.store(ring + channels * stride_ring + position % K, xt.to(ring.dtype.element_ty), mask=mask_c & live & write)
    acc = tl.sum(inputs * w_old, 0) + xt.to(tl.float32) * w_new
    return acc / (1.0 + tl.exp(-acc))


@triton.jit
def _gdn_decode_fused_kernel(
    mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, state_slots, seq_lens, out,
    stride_x, stride_z, stride_a, stride_b, stride_w, stride_s_slot, stride_s_c, stride_h_slot, stride_out,
    eps, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, K: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    seq, head = tl.program_id(0), tl.program_id(1)
    group: tl.constexpr = HV // HK
    key_head = head // group
    seq64 = seq.to(tl.int64)
    slot = tl.load(state_slots + seq).to(tl.int64)
    live = slot >= 0
    safe_slot = tl.where(live, slot, 0)

    offs_k, offs_v = tl.arange(0, BK), tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    # The state first: its load has the longest way to come and depends on nothing else. Its addresses
    # are one base and int32 offsets (127 registers a thread at 8 warps; through a block pointer, 184).
    tile = offs_k[:, None] * DV + offs_v[None, :]
    mask_kv = mask_k[:, None] & mask_v[None, :]
    h_base = h_pool + safe_slot * stride_h_slot + head * DK * DV
    state = tl.load(h_base + tile, mask=mask_kv & live, other=0.0).to(tl.float32)

    position = tl.load(seq_lens + seq) - 1
    x_row = mixed + seq64 * stride_x
    ring = conv_state + safe_slot * stride_s_slot
    first_of_key_head = head % group == 0  # the one program that writes the q/k channels' new inputs
    q = _conv_token(x_row, conv_weight, ring, key_head * DK + offs_k, mask_k, live, position, first_of_key_head,
                    stride_w, stride_s_c, K, BLOCK_K)
    k = _conv_token(x_row, conv_weight, ring, HK * DK + key_head * DK + offs_k, mask_k, live, position,
                    first_of_key_head, stride_w, stride_s_c, K, BLOCK_K)
    v = _conv_token(x_row, conv_weight, ring, 2 * HK * DK + head * DV + offs_v, mask_v, live, position, True,
                    stride_w, stride_s_c, K, BLOCK_K)

    at = tl.load(a + seq64 * stride_a + head).to(tl.float32) + tl.load(dt_bias + head).to(tl.float32)
    bt = tl.load(b + seq64 * stride_b + head).to(tl.float32)
    softplus = tl.where(at > 20.0, at, tl.log(1.0 + tl.exp(tl.minimum(at, 20.0))))
    decay = tl.exp(-tl.exp(tl.load(A_log + head).to(tl.float32)) * softplus)
    beta = 1.0 / (1.0 + tl.exp(-bt))
    # As in triton_recurrent._update: every reduction is taken on the raw q, k and the old state at once
    # (S' = d S + k delta^T, delta = beta (v - d S^T k), o = S'^T q = d S^T q + (q.k) delta).
    rq = 1.0 / tl.sqrt(tl.sum(q * q, 0) + 1e-6)
    rk = 1.0 / tl.sqrt(tl.sum(k * k, 0) + 1e-6)
    qk = tl.sum(q * k, 0) * (rq * rk * scale)
    s_q = tl.sum(state * q[:, None], 0) * (rq * scale)
    s_k = tl.sum(state * k[:, None], 0) * rk
    delta = (v - decay * s_k) * beta
    o = decay * s_q + qk * delta
    tl.store(h_base + tile, (state * decay + (k * rk)[:, None] * delta[None, :]).to(h_pool.dtype.element_ty),
             mask=mask_kv & live)

    gate = tl.load(z + seq64 * stride_z + head * DV + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    norm_w = tl.load(norm_weight + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(o * o, 0) / DV + eps)
    y = o * rstd * norm_w * (gate / (1.0 + tl.exp(-gate)))
    tl.store(out + seq64 * stride_out + head * DV + offs_v, y.to(out.dtype.element_ty), mask=mask_v)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """2-D with unit stride along the row (the layer passes column slices of one projection)."""
    x = x.reshape(x.shape[0], -1)
    return x if x.stride(-1) == 1 else x.contiguous()


def gdn_decode_fused(mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, eps: float,
                     state_slots, seq_lens, num_warps: int = 8) -> torch.Tensor:
    """Same contract as decode_fused_reference.gdn_decode_fused; h_pool must be contiguous."""
    from deltaserve.kernels.gdn.decode_fused_reference import decode_head_shape

    mixed, z, a, b = (_rows(x) for x in (mixed, z, a, b))
    assert h_pool.is_contiguous()
    assert conv_state.stride(-1) == 1 and conv_weight.stride(-1) == 1
    assert conv_state.shape[-1] == conv_weight.shape[1], "the conv state is a ring of K inputs"
    batch, conv_dim = mixed.shape
    hk, hv, dk, dv = decode_head_shape(conv_dim, h_pool)
    assert hv % hk == 0 and 2 * hk * dk + hv * dv == conv_dim
    out = torch.empty((batch, hv * dv), dtype=mixed.dtype, device=mixed.device)
    if batch == 0:
        return out
    _gdn_decode_fused_kernel[(batch, hv)](
        mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, state_slots, seq_lens, out,
        mixed.stride(0), z.stride(0), a.stride(0), b.stride(0), conv_weight.stride(0), conv_state.stride(0),
        conv_state.stride(1), h_pool.stride(0), out.stride(0), eps, dk**-0.5,
        HK=hk, HV=hv, DK=dk, DV=dv, K=conv_weight.shape[1], BK=triton.next_power_of_2(dk),
        BV=triton.next_power_of_2(dv), BLOCK_K=triton.next_power_of_2(conv_weight.shape[1]),
        num_warps=num_warps, **launch_options(mixed),
    )
    return out
