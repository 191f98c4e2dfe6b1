"""The skinny GEMM (kernels/linear) against cuBLAS at the projections of the benchmark shapes, 1-16 rows,
bf16, on one GPU: time (CUDA-graph replays) and the bandwidth of reading the weight.

    python benchmarks/skinny_gemm_bench.py --out benchmarks/results/skinny_gemm.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernels_check import time_graph_us  # noqa: E402
from deltaserve.kernels.linear.triton_skinny_gemm import default_tiles, skinny_gemm  # noqa: E402

# (name, N, K): the weights a decode step reads in the Qwen3.5-9B and -35B-A3B shapes
SHAPES = [("9b gate_up", 24576, 4096), ("9b down", 4096, 12288), ("9b gdn in_proj", 12352, 4096),
          ("9b attention qkv", 10240, 4096), ("9b out / o_proj", 4096, 4096), ("9b lm_head", 248320, 4096),
          ("35b gdn in_proj", 12352, 2048), ("35b out / o_proj", 2048, 4096), ("35b attention qkv", 9216, 2048),
          ("35b lm_head", 248320, 2048)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    for name, n, k in SHAPES:
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in (1, 4, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            expected = x.float() @ weight.float().T
            out = skinny_gemm(x, weight).float()
            cublas = time_graph_us(lambda: torch.nn.functional.linear(x, weight))
            skinny = time_graph_us(lambda: skinny_gemm(x, weight))
            row = {"shape": name, "rows": m, "N": n, "K": k, "tiles": list(default_tiles(n)),
                   "rel_err": round(((out - expected).norm() / expected.norm()).item(), 5),
                   "cublas_us": round(cublas, 2), "skinny_us": round(skinny, 2),
                   "cublas_tb_s": round(n * k * 2 / cublas / 1e6, 2), "skinny_tb_s": round(n * k * 2 / skinny / 1e6, 2)}
            rows.append(row)
            print(row, flush=True)
    results_io.write(args.out, {**results_io.header(), "rows": rows})


if __name__ == "__main__":
    main()
