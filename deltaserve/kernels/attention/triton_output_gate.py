"""out * sigmoid(gate) for the fresh-prefill attention path, in one pass: the attention output read where
it lies (sdpa's, seen through a transpose) and the gate where it was sliced out of q_proj's output,
written as the contiguous [T, H * D] rows the output projection takes. As torch ops it was a sigmoid, a
product and a copy of the output, each a pass of its own over a prompt's [T, H, D]: 185 us at 8192
tokens of the 35B-A3B shape on the H200, against 56 for this kernel (benchmarks/results/fresh_attention.json)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _output_gate_kernel(out, gate, y, stride_o_t, stride_o_h, stride_g_t, stride_g_h, HEADS: tl.constexpr,
                        HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (row, tile of BLOCK_H heads); the product in fp32, rounded once."""
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (heads < HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    o = tl.load(out + row * stride_o_t + heads[:, None] * stride_o_h + d[None, :], mask=mask, other=0.0)
    g = tl.load(gate + row * stride_g_t + heads[:, None] * stride_g_h + d[None, :], mask=mask, other=0.0)
    gated = o.to(tl.float32) / (1.0 + tl.exp(-g.to(tl.float32)))
    tl.store(y + row * HEADS * HEAD_DIM + heads[:, None] * HEAD_DIM + d[None, :], gated.to(y.dtype.element_ty),
             mask=mask)


def output_gate(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """out, gate [T, H, D] (any strides but the last); returns out * sigmoid(gate), [T, H, D] contiguous."""
    out = out if out.stride(-1) == 1 else out.contiguous()
    gate = gate if gate.stride(-1) == 1 else gate.contiguous()
    tokens, heads, head_dim = out.shape
    y = torch.empty((tokens, heads, head_dim), dtype=out.dtype, device=out.device)
    if tokens == 0:
        return y
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(heads), max(1, 4096 // block_d))  # about 4096 values a program
    _output_gate_kernel[(tokens, triton.cdiv(heads, block_h))](
        out, gate, y, out.stride(0), out.stride(1), gate.stride(0), gate.stride(1), HEADS=heads, HEAD_DIM=head_dim,
        BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4)
    return y
