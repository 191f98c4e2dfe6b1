"""Loading PartialSums inside a kernel (see partial_sums.py): every part of a block in one 2-D load, then
one reduction over the parts. Its order is a fixed tree, so a run reproduces itself bit for bit; the
loads are in flight together (a loop of one load per part measured slower in the MoE router's
kernel, 5.2 against 3.1 us a call with 16 parts, benchmarks/results/profile_qwen3.5-35b-a3b_c1.json)."""

import triton
import triton.language as tl


@triton.jit
def load_summed(ptrs, mask, stride_part, PARTS: tl.constexpr, BLOCK_P: tl.constexpr):
    """The fp32 sum over PARTS parts (stride_part elements apart, BLOCK_P >= PARTS a power of two) of the
    values at ptrs, a 1-D block or one element; masked lanes are 0."""
    if PARTS == 1:
        summed = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    else:
        offs_p = tl.arange(0, BLOCK_P)
        tile = tl.load(tl.expand_dims(ptrs, 0) + offs_p[:, None] * stride_part,
                       mask=(offs_p[:, None] < PARTS) & tl.expand_dims(mask, 0), other=0.0)
        summed = tl.sum(tile.to(tl.float32), 0)
    return summed
