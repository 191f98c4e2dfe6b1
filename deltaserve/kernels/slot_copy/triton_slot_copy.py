"""copy_slot (see reference.py) as one Triton launch over (layer, piece of the slot).

torch's copy of `pool[:, slot]` takes the strided elementwise path, and over a snapshot pool of many
GiB it splits into several launches to keep 32-bit offsets: restoring the 30 GDN layers' states of a
Qwen3.5-35B-A3B sequence (60 MiB) took eight launches and ~100 us on the H200, where reading and
writing it once is ~30 us. Here each program copies one contiguous piece of one layer's slot with
64-bit offsets.
"""

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _copy_slot_kernel(src, dst, src_offset, dst_offset, stride_src_layer, stride_dst_layer, numel,
                      BLOCK: tl.constexpr):
    layer, piece = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = piece * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    values = tl.load(src + layer * stride_src_layer + src_offset + offs, mask=mask)
    tl.store(dst + layer * stride_dst_layer + dst_offset + offs, values.to(dst.dtype.element_ty), mask=mask)


def copy_slot(src: torch.Tensor, src_slot: int, dst: torch.Tensor, dst_slot: int) -> None:
    """Same contract as the reference; each layer's slot must be contiguous in both pools."""
    numel = src[0, 0].numel()
    assert dst[0, 0].numel() == numel and src.shape[0] == dst.shape[0]
    assert src[0, 0].is_contiguous() and dst[0, 0].is_contiguous()
    grid = (src.shape[0], triton.cdiv(numel, BLOCK))
    _copy_slot_kernel[grid](src, dst, src_slot * src.stride(1), dst_slot * dst.stride(1), src.stride(0),
                            dst.stride(0), numel, BLOCK=BLOCK, num_warps=8)
