"""KV store: each token's k/v rows [Hk, D] copied to its page slot; slot -1 (padding) writes nothing."""

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k, v, k_cache, v_cache, slot_mapping,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_kc_block, stride_kc_pos, stride_kc_head, stride_vc_block, stride_vc_pos, stride_vc_head,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token, head = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_mapping + token).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = (offs < HEAD_DIM) & (slot >= 0)
    block, pos = slot // PAGE, slot % PAGE
    t64 = token.to(tl.int64)
    k_row = tl.load(k + t64 * stride_k_t + head * stride_k_h + offs, mask=mask)
    v_row = tl.load(v + t64 * stride_v_t + head * stride_v_h + offs, mask=mask)
    k_dst = k_cache + block * stride_kc_block + pos * stride_kc_pos + head * stride_kc_head + offs
    v_dst = v_cache + block * stride_vc_block + pos * stride_vc_pos + head * stride_vc_head + offs
    tl.store(k_dst, k_row.to(k_cache.dtype.element_ty), mask=mask)
    tl.store(v_dst, v_row.to(v_cache.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    tokens, heads, head_dim = k.shape
    if tokens == 0:
        return
    _store_kv_kernel[(tokens, heads)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, PAGE=k_cache.shape[1], BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=1 if head_dim <= 128 else 2,
    )
