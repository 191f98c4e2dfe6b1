"""Per-head RMSNorm (optional), rotary and the KV store of an attention layer's new rows in one kernel:
one program per (token, head) over the q heads then the k heads (on a long pass, per (tokens, head)). A q
head is written to the returned tensor; a k head goes straight to its cache slot, with the matching v
head beside it, and with k_out also to a [T, Hk, D] tensor (a long prompt's first chunk attends over
its own k rows, not the cache).
At decode this is one launch where the unfused path takes four (q norm, k norm, rotary, store).

Rounding follows the unfused ops: the normalised row is rounded to the input dtype before it is rotated,
and the rotated row to the input dtype before it is stored.
"""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid

# A long pass takes LONG_BLOCK_T tokens a program: with one (token, head) a program, the 18 heads of a
# 32768-token Qwen3.5-35B-A3B prompt were 590k programs of a few hundred bytes each, and the kernel took
# 711 us a layer on the H200, some 4x its bytes' time. 8 tokens at 2 warps: 242 us at 32768 tokens
# against 805 (floor 222), 62 at 8192 against 201 (kernels_check_rotary_tiles_u_dtype.json).
# On the GPU the token tiles put some values one bf16 step from a token a program's, at the same error
# against fp32 (kernels_check_rotary_store_kv.json): a long pass's rows may round apart from a short pass's,
# while the same pass over the same rows (exact replay) gives the same bytes.
LONG_MIN_TOKENS = 512
LONG_BLOCK_T = 8
LONG_WARPS = 2


@triton.jit
def _normed_part(src, weight, cols, mask, rstd, offset, HAS_NORM: tl.constexpr):
    """Channels `cols` [1, C] of the rows `src` [R, 1], normalised and rounded as the RMSNorm op rounds
    them, in fp32 [R, C]."""
    x = tl.load(src + cols, mask=mask, other=0.0)
    if HAS_NORM:
        w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32) + offset
        x = (x.to(tl.float32) * rstd * w).to(src.dtype.element_ty)
    return x.to(tl.float32)


@triton.jit
def _rotated_rows(src, weight, dst, cos, sin, live, offset, eps, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    """Normalises, rotates and writes head rows from src to dst (dst's dtype): src, dst and live [R, 1]
    (the rows' first channels, and which rows to write), cos and sin [R, BLOCK_HALF]."""
    rstd = 1.0
    if HAS_NORM:
        cols = tl.arange(0, BLOCK_D)[None, :]
        row = tl.load(src + cols, mask=live & (cols < HEAD_DIM), other=0.0).to(tl.float32)
        rstd = (1.0 / tl.sqrt(tl.sum(row * row, 1) / HEAD_DIM + eps))[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = live & (offs < HALF)
    x1 = _normed_part(src, weight, offs, mask, rstd, offset, HAS_NORM)
    x2 = _normed_part(src, weight, HALF + offs, mask, rstd, offset, HAS_NORM)
    out_ty = src.dtype.element_ty
    tl.store(dst + offs, (x1 * cos - x2 * sin).to(out_ty).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + offs, (x2 * cos + x1 * sin).to(out_ty).to(dst.dtype.element_ty), mask=mask)
    if 2 * HALF < HEAD_DIM:  # channels past the rotary part pass through (normalised)
        rest = 2 * HALF + tl.arange(0, BLOCK_D)[None, :]
        keep = live & (rest < HEAD_DIM)
        x = _normed_part(src, weight, rest, keep, rstd, offset, HAS_NORM)
        tl.store(dst + rest, x.to(out_ty).to(dst.dtype.element_ty), mask=keep)


@triton.jit
def _angles(cos_sin_cache, pos, live, stride_cache, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """cos and sin [R, BLOCK_HALF] in fp32 of the positions pos [R] (rows where live)."""
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    angles = cos_sin_cache + pos.to(tl.int64)[:, None] * stride_cache + offs
    in_half = live[:, None] & (offs < HALF)
    cos = tl.load(angles, mask=in_half, other=0.0).to(tl.float32)
    sin = tl.load(angles + HALF, mask=in_half, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_store_kv_kernel(
    q, k, v, q_out, k_out, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, q_norm, k_norm, eps, offset,
    num_tokens, stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_ko_t, stride_cache,
    stride_kc_block, stride_kc_pos, stride_kc_head, stride_vc_block, stride_vc_pos, stride_vc_head,
    Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_HALF: tl.constexpr, HAS_NORM: tl.constexpr, HAS_K_OUT: tl.constexpr = False,
    BLOCK_T: tl.constexpr = 1, USE_PDL: tl.constexpr = False, q_rows=None, num_q_tokens=0,
    HAS_Q_ROWS: tl.constexpr = False,
):
    """One program per (BLOCK_T tokens, head). With HAS_Q_ROWS q holds num_q_tokens rows, at the
    positions of the rows q_rows."""
    wait_for_prior_grid(USE_PDL)
    head = tl.program_id(1)
    token = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = token < num_tokens
    t = token[:, None]
    if head < Q_HEADS:
        if HAS_Q_ROWS:
            live = token < num_q_tokens
            pos = tl.load(positions + tl.load(q_rows + token, mask=live, other=0), mask=live, other=0)
        else:
            pos = tl.load(positions + token, mask=live, other=0)
        cos, sin = _angles(cos_sin_cache, pos, live, stride_cache, HALF, BLOCK_HALF)
        _rotated_rows(q + t * stride_q_t + head * stride_q_h, q_norm, q_out + (t * Q_HEADS + head) * HEAD_DIM,
                      cos, sin, live[:, None], offset, eps, HEAD_DIM, HALF, BLOCK_D, BLOCK_HALF, HAS_NORM)
    else:
        cos, sin = _angles(cos_sin_cache, tl.load(positions + token, mask=live, other=0), live, stride_cache, HALF,
                           BLOCK_HALF)
        kh = head - Q_HEADS
        if HAS_K_OUT:  # every row, padding or not: the caller attends over them
            _rotated_rows(k + t * stride_k_t + kh * stride_k_h, k_norm, k_out + t * stride_ko_t + kh * HEAD_DIM,
                          cos, sin, live[:, None], offset, eps, HEAD_DIM, HALF, BLOCK_D, BLOCK_HALF, HAS_NORM)
        slot = tl.load(slot_mapping + token, mask=live, other=-1).to(tl.int64)
        stored = (live & (slot >= 0))[:, None]  # slot -1: a padding row, stored nowhere
        block, at = (slot // PAGE)[:, None], (slot % PAGE)[:, None]
        _rotated_rows(k + t * stride_k_t + kh * stride_k_h, k_norm,
                      k_cache + block * stride_kc_block + at * stride_kc_pos + kh * stride_kc_head,
                      cos, sin, stored, offset, eps, HEAD_DIM, HALF, BLOCK_D, BLOCK_HALF, HAS_NORM)
        cols = tl.arange(0, BLOCK_D)[None, :]
        keep = stored & (cols < HEAD_DIM)
        row = tl.load(v + t * stride_v_t + kh * stride_v_h + cols, mask=keep)
        dst = v_cache + block * stride_vc_block + at * stride_vc_pos + kh * stride_vc_head + cols
        tl.store(dst, row.to(v_cache.dtype.element_ty), mask=keep)


def rotary_store_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                    cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, q_norm: torch.Tensor | None = None,
                    k_norm: torch.Tensor | None = None, eps: float = 1e-6, norm_offset: float = 0.0,
                    k_out: bool = False, block_t: int | None = None, num_warps: int | None = None,
                    q_rows: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as the reference: q [T, Hq, D] (or [R, Hq, D] of the rows q_rows), k/v [T, Hk, D]
    (strided views welcome); returns q rotated (and with k_out, k rotated too). block_t: tokens a program
    (by default one, LONG_BLOCK_T from LONG_MIN_TOKENS on); num_warps likewise."""
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    tokens = k.shape[0]
    q_heads, head_dim = q.shape[1:]
    k_heads = k.shape[1]
    half = cos_sin_cache.shape[-1] // 2
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_rotated = torch.empty(k.shape, dtype=k.dtype, device=k.device) if k_out else q_out
    if tokens:
        has_norm = q_norm is not None
        long = tokens >= LONG_MIN_TOKENS
        block_t = block_t or (LONG_BLOCK_T if long else 1)
        num_warps = num_warps or (LONG_WARPS if long else 1 if head_dim <= 128 else 2)
        _rotary_store_kv_kernel[(triton.cdiv(tokens, block_t), q_heads + k_heads)](
            q, k, v, q_out, k_rotated, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
            q_norm if has_norm else q, k_norm if has_norm else k, eps, float(norm_offset), tokens,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_rotated.stride(0),
            cos_sin_cache.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2),
            Q_HEADS=q_heads, HEAD_DIM=head_dim, HALF=half, PAGE=k_cache.shape[1],
            BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_HALF=triton.next_power_of_2(half), HAS_NORM=has_norm,
            HAS_K_OUT=k_out, BLOCK_T=block_t, num_warps=num_warps, **launch_options(q),
            **(dict(q_rows=q_rows, num_q_tokens=q.shape[0], HAS_Q_ROWS=True) if q_rows is not None else {}),
        )
    return (q_out, k_rotated) if k_out else q_out
