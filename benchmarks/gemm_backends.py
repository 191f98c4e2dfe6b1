"""The decode step's projections on each of torch's BLAS backends, at the row counts of large batches.

    python benchmarks/gemm_backends.py --rows 32,64,128 --out benchmarks/results/gemm_backends.json

The 9B shape's projections as the model runs them (`kernels.linear` / `linear_partial`: the out and down
projections split along K into fp32 parts, the rest whole), timed in CUDA graphs of calls that cycle
through three copies of each weight, so no call finds its weight in L2. Each runs under
`torch.backends.cuda.preferred_blas_library` "cublas" (torch's default) and "cublaslt", with and without
`allow_bf16_reduced_precision_reduction`; the table gives us per call and TB/s of weight read, and the
largest difference from the default's output.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernels_check import time_graph_us  # noqa: E402

# (name, N, K) of the Qwen3.5-9B shape's decode projections: hidden 4096, intermediate 12288,
# GDN projection 2 * 16 * 128 + 2 * 32 * 128 + 2 * 32, attention q (gated) / k / v 2 * 4096 + 2 * 1024.
PROJECTIONS = [("gate_up", 24576, 4096), ("down", 4096, 12288), ("gdn_in_proj", 12352, 4096),
               ("out_proj", 4096, 4096), ("qkv", 10240, 4096), ("lm_head", 248320, 4096)]
SETTINGS = [("cublas", True), ("cublaslt", True), ("cublas", False), ("cublaslt", False)]


def run(rows: list[int]) -> list[dict]:
    from deltaserve import kernels

    out = []
    for name, n, k in PROJECTIONS:
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(3)]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            partial = name in ("down", "out_proj")
            op = (lambda w: kernels.linear_partial(x, w)) if partial else (  # noqa: E731
                lambda w: kernels.linear(x, w, out_dtype=torch.float32 if name == "lm_head" else None))
            row = {"projection": name, "rows": m, "N": n, "K": k, "split": partial}
            reference = None
            for library, reduced in SETTINGS:
                torch.backends.cuda.preferred_blas_library(library)
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
                got = op(weights[0])
                got = got.parts.sum(0) if hasattr(got, "parts") else got.float()
                reference = got if reference is None else reference
                cycle = itertools.cycle(weights)
                us = time_graph_us(lambda: op(next(cycle)), calls=12)
                key = f"{library}{'' if reduced else '_fp32_reduction'}"
                row[key] = {"us": round(us, 2), "tb_s": round(n * k * 2 / us / 1e6, 2),
                            "max_abs_diff": float((got - reference).abs().max())}
            torch.backends.cuda.preferred_blas_library("cublas")
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
            out.append(row)
            print(row, flush=True)
        del weights
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="32,64,128")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    results = run(rows)
    results_io.write(args.out, {**results_io.header(), "projections": results})
    keys = [f"{lib}{'' if red else '_fp32_reduction'}" for lib, red in SETTINGS]
    print(f"{'projection':<12} {'rows':>4} " + " ".join(f"{k:>24}" for k in keys))
    for r in results:
        print(f"{r['projection']:<12} {r['rows']:>4} " + " ".join(f"{r[k]['us']:>15.2f} us {r[k]['tb_s']:>4.2f}" for k in keys))


if __name__ == "__main__":
    main()
