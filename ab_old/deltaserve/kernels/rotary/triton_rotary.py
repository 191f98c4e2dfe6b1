"""Rotary embedding (neox halves) on the first `rotary_dim` channels of each q and k head; the rest of
each head is copied through. One program per (token, head) over the q heads then the k heads."""

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_row(src, dst, cos, sin, HALF: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr,
                BLOCK_PASS: tl.constexpr):
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    x1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst + offs, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + offs, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=mask)
    if BLOCK_PASS > 0:
        rest = 2 * HALF + tl.arange(0, BLOCK_PASS)
        keep = rest < HEAD_DIM
        tl.store(dst + rest, tl.load(src + rest, mask=keep), mask=keep)


@triton.jit
def _rotary_kernel(
    q, k, q_out, k_out, positions, cos_sin_cache,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_cache,
    Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):
    token, head = tl.program_id(0), tl.program_id(1)
    t64 = token.to(tl.int64)
    pos = tl.load(positions + token).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    cos = tl.load(cos_sin_cache + pos * stride_cache + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_cache + pos * stride_cache + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    if head < Q_HEADS:
        _rotate_row(q + t64 * stride_q_t + head * stride_q_h, q_out + (t64 * Q_HEADS + head) * HEAD_DIM,
                    cos, sin, HALF, HEAD_DIM, BLOCK_HALF, BLOCK_PASS)
    else:
        kh = head - Q_HEADS
        _rotate_row(k + t64 * stride_k_t + kh * stride_k_h, k_out + (t64 * K_HEADS + kh) * HEAD_DIM,
                    cos, sin, HALF, HEAD_DIM, BLOCK_HALF, BLOCK_PASS)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as the reference: new (q, k), rotated on cos_sin_cache's width."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    tokens, q_heads, head_dim = q.shape
    k_heads = k.shape[1]
    half = cos_sin_cache.shape[-1] // 2
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if tokens:
        rest = head_dim - 2 * half
        _rotary_kernel[(tokens, q_heads + k_heads)](
            q, k, q_out, k_out, positions, cos_sin_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
            Q_HEADS=q_heads, K_HEADS=k_heads, HEAD_DIM=head_dim, HALF=half,
            BLOCK_HALF=triton.next_power_of_2(half), BLOCK_PASS=triton.next_power_of_2(rest) if rest else 0,
            num_warps=1,
        )
    return q_out, k_out
