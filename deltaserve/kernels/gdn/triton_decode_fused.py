"""The whole GDN decode step of one layer in one launch: conv1d update + SiLU of q/k/v, q/k L2 norm,
gating, the gated delta rule on the fp32 state in place, and the gated RMSNorm of the output.

One program per (sequence, key head). It convolves its key head's q and k channels once, then walks
the value heads that share that key head, each with its whole [Dk, Dv] state in registers (the gated
norm needs the head's full Dv row). A program per key head rather than per value head because the
q/k conv state is updated in place: with several programs reading it, the one that writes could
overwrite it before another has read it; here every conv-state channel has exactly one reader and
writer. A negative slot marks a padding row: it computes on zero conv and recurrent states and writes
no state. Graph-safe: the grid depends on shapes only and nothing syncs with the host.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _window(x_row, state_base, channels, mask_c, live, stride_s_c, shift: tl.constexpr, K: tl.constexpr,
            BLOCK_K: tl.constexpr):
    """[BLOCK_C, BLOCK_K] tile: column j holds input j + shift of the history [old state (K-1) | x]."""
    cols = tl.arange(0, BLOCK_K) + shift
    in_state = cols < K - 1
    from_state = tl.load(state_base + channels[:, None] * stride_s_c + cols[None, :],
                         mask=(mask_c & live)[:, None] & in_state[None, :], other=0.0)
    from_x = tl.load(x_row + channels[:, None] + cols[None, :] * 0,
                     mask=mask_c[:, None] & (cols == K - 1)[None, :], other=0.0)
    return from_state.to(tl.float32) + from_x.to(tl.float32)


@triton.jit
def _conv_update(x_row, weight, state_base, channels, mask_c, live, stride_w, stride_s_c,
                 K: tl.constexpr, BLOCK_K: tl.constexpr):
    """silu(causal conv) of one token on `channels`; shifts x into their conv state (not for padding)."""
    cols = tl.arange(0, BLOCK_K)
    w = tl.load(weight + channels[:, None] * stride_w + cols[None, :], mask=mask_c[:, None] & (cols < K)[None, :],
                other=0.0).to(tl.float32)
    acc = tl.sum(_window(x_row, state_base, channels, mask_c, live, stride_s_c, 0, K, BLOCK_K) * w, 1)
    new_state = _window(x_row, state_base, channels, mask_c, live, stride_s_c, 1, K, BLOCK_K)
    tl.debug_barrier()  # every read of the old state above happens before it is overwritten
    tl.store(state_base + channels[:, None] * stride_s_c + cols[None, :],
             new_state.to(state_base.dtype.element_ty), mask=(mask_c & live)[:, None] & (cols < K - 1)[None, :])
    return acc / (1.0 + tl.exp(-acc))


@triton.jit
def _gdn_decode_fused_kernel(
    mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, state_slots, out,
    stride_x, stride_z, stride_a, stride_b, stride_w, stride_s_slot, stride_s_c, stride_h_slot, stride_out,
    eps, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, K: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BLOCK_K: tl.constexpr,
):
    seq, key_head = tl.program_id(0), tl.program_id(1)
    group: tl.constexpr = HV // HK
    seq64 = seq.to(tl.int64)
    slot = tl.load(state_slots + seq).to(tl.int64)
    live = slot >= 0
    safe_slot = tl.where(live, slot, 0)
    x_row = mixed + seq64 * stride_x
    conv_base = conv_state + safe_slot * stride_s_slot

    offs_k = tl.arange(0, BK)
    mask_k = offs_k < DK
    q = _conv_update(x_row, conv_weight, conv_base, key_head * DK + offs_k, mask_k, live, stride_w, stride_s_c,
                     K, BLOCK_K)
    k = _conv_update(x_row, conv_weight, conv_base, HK * DK + key_head * DK + offs_k, mask_k, live, stride_w,
                     stride_s_c, K, BLOCK_K)
    q = q * (scale / tl.sqrt(tl.sum(q * q, 0) + 1e-6))
    k = k * (1.0 / tl.sqrt(tl.sum(k * k, 0) + 1e-6))

    offs_v = tl.arange(0, BV)
    mask_v = offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]
    norm_w = tl.load(norm_weight + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    for g in range(group):
        head = key_head * group + g
        v = _conv_update(x_row, conv_weight, conv_base, 2 * HK * DK + head * DV + offs_v, mask_v, live, stride_w,
                         stride_s_c, K, BLOCK_K)
        at = tl.load(a + seq64 * stride_a + head).to(tl.float32) + tl.load(dt_bias + head).to(tl.float32)
        bt = tl.load(b + seq64 * stride_b + head).to(tl.float32)
        softplus = tl.where(at > 20.0, at, tl.log(1.0 + tl.exp(tl.minimum(at, 20.0))))
        decay = tl.exp(-tl.exp(tl.load(A_log + head).to(tl.float32)) * softplus)
        beta = 1.0 / (1.0 + tl.exp(-bt))

        h_ptrs = h_pool + safe_slot * stride_h_slot + head * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
        state = tl.load(h_ptrs, mask=mask_kv & live, other=0.0) * decay
        delta = (v - tl.sum(state * k[:, None], 0)) * beta
        state = state + k[:, None] * delta[None, :]
        o = tl.sum(state * q[:, None], 0)
        tl.store(h_ptrs, state, mask=mask_kv & live)

        gate = tl.load(z + seq64 * stride_z + head * DV + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(o * o, 0) / DV + eps)
        y = o * rstd * norm_w * (gate / (1.0 + tl.exp(-gate)))
        tl.store(out + seq64 * stride_out + head * DV + offs_v, y.to(out.dtype.element_ty), mask=mask_v)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """2-D with unit stride along the row (the layer passes column slices of one projection)."""
    x = x.reshape(x.shape[0], -1)
    return x if x.stride(-1) == 1 else x.contiguous()


def gdn_decode_fused(mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, eps: float,
                     state_slots, num_warps: int | None = None) -> torch.Tensor:
    """Same contract as decode_fused_reference.gdn_decode_fused; h_pool must be fp32 and contiguous."""
    from deltaserve.kernels.gdn.decode_fused_reference import decode_head_shape

    mixed, z, a, b = (_rows(x) for x in (mixed, z, a, b))
    assert h_pool.is_contiguous() and h_pool.dtype == torch.float32
    assert conv_state.stride(-1) == 1 and conv_weight.stride(-1) == 1
    batch, conv_dim = mixed.shape
    hk, hv, dk, dv = decode_head_shape(conv_dim, h_pool)
    assert hv % hk == 0 and 2 * hk * dk + hv * dv == conv_dim
    out = torch.empty((batch, hv * dv), dtype=mixed.dtype, device=mixed.device)
    if batch == 0:
        return out
    block_k, block_v = triton.next_power_of_2(dk), triton.next_power_of_2(dv)
    if num_warps is None:
        num_warps = 8 if block_k * block_v >= 8192 else 4
    _gdn_decode_fused_kernel[(batch, hk)](
        mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, state_slots, out,
        mixed.stride(0), z.stride(0), a.stride(0), b.stride(0), conv_weight.stride(0), conv_state.stride(0),
        conv_state.stride(1), h_pool.stride(0), out.stride(0), eps, dk**-0.5,
        HK=hk, HV=hv, DK=dk, DV=dv, K=conv_weight.shape[1], BK=block_k, BV=block_v,
        BLOCK_K=triton.next_power_of_2(conv_weight.shape[1]), num_warps=num_warps,
    )
    return out
