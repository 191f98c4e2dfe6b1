"""The fresh-prefill attention path's pieces on one GPU, at the Qwen3.5 shapes (16 query heads of 256,
2 key heads for 35B-A3B, 4 for 9B): grouped-query attention by expanded copies of k and v against
sdpa's enable_gqa, and the output gate as torch ops (the copy out of sdpa's layout, a sigmoid and a
product) against the fused kernel (triton_output_gate.py).

    python benchmarks/fresh_attention_bench.py --out benchmarks/results/fresh_attention.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernel_times import time_us  # noqa: E402
from deltaserve.kernels.attention.reference import output_gate as reference_gate  # noqa: E402
from deltaserve.kernels.attention.triton_output_gate import output_gate  # noqa: E402

SHAPES = {"qwen3.5-35b-a3b": (16, 2), "qwen3.5-9b": (16, 4)}
HEAD_DIM = 256


def sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                          is_causal=True, scale=HEAD_DIM**-0.5, **kw)


def measure(shape: str, tokens: int) -> dict:
    q_heads, kv_heads = SHAPES[shape]
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(tokens, q_heads, HEAD_DIM, **bf16)
    k, v = torch.randn(tokens, kv_heads, HEAD_DIM, **bf16), torch.randn(tokens, kv_heads, HEAD_DIM, **bf16)
    _, gate = torch.randn(tokens, q_heads, 2 * HEAD_DIM, **bf16).chunk(2, dim=-1)  # sliced out of q_proj's output
    group = q_heads // kv_heads

    def expanded():
        return sdpa(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))

    def grouped():
        return sdpa(q, k, v, enable_gqa=True)

    out = grouped()[0].transpose(0, 1)
    copy = torch.empty_like(q)

    def torch_gate():
        copy.copy_(out)
        return copy * torch.sigmoid(gate)

    fused = output_gate(out, gate)
    return {"shape": shape, "tokens": tokens,
            "expanded_kv_sdpa_us": round(time_us(expanded), 1), "enable_gqa_sdpa_us": round(time_us(grouped), 1),
            "gqa_outputs_equal": bool(torch.equal(expanded(), grouped())),
            "sdpa_output_transposed_is_contiguous": out.is_contiguous(),
            "torch_copy_sigmoid_mul_us": round(time_us(torch_gate), 1),
            "fused_output_gate_us": round(time_us(lambda: output_gate(out, gate)), 1),
            "fused_gate_max_abs_err_vs_reference": (fused.float() - reference_gate(out, gate).float()).abs().max().item(),
            "torch_gate_max_abs_diff_vs_fused": (torch_gate().float() - fused.float()).abs().max().item()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="8192,32768")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {**results_io.header(), "rows": []}
    for shape in SHAPES:
        for tokens in (int(t) for t in args.tokens.split(",")):
            result["rows"].append(measure(shape, tokens))
            print(result["rows"][-1], flush=True)
            results_io.write(args.out, result)


if __name__ == "__main__":
    main()
