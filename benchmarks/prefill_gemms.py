"""The prefill pass's projections on one GPU: TFLOP/s of each way torch can run them, at long-pass row counts.

    python benchmarks/prefill_gemms.py --rows 4096,8192 --out benchmarks/results/prefill_gemms.json

The 9B shape's projections at M rows (bf16): `linear` is F.linear as the model runs them (torch's default
BLAS, cuBLAS), `cublaslt` the same under torch.backends.cuda.preferred_blas_library("cublaslt"), and
`transposed` the product computed as W X^T on cuBLASLt (its output [N, M], the other operand order the
library can pick kernels for). Each is the median of triton's do_bench; the table gives ms and TFLOP/s,
and the largest difference from `linear`'s output (transposed back).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402

# (name, N, K) of the Qwen3.5-9B shape: hidden 4096, intermediate 12288, GDN projection
# 2 * 16 * 128 + 2 * 32 * 128 + 2 * 32, attention q (gated) / k / v 2 * 4096 + 2 * 1024.
PROJECTIONS = [("gate_up", 24576, 4096), ("down", 4096, 12288), ("gdn_in_proj", 12352, 4096),
               ("out_proj", 4096, 4096), ("qkv", 10240, 4096)]


def median_ms(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def variants(x: torch.Tensor, w: torch.Tensor) -> dict:
    """name -> (the BLAS library it runs on, the product)."""
    return {"linear": ("cublas", lambda: F.linear(x, w)), "cublaslt": ("cublaslt", lambda: F.linear(x, w)),
            "transposed": ("cublaslt", lambda: torch.mm(w, x.t()))}


def run(rows: list[int]) -> list[dict]:
    out = []
    for name, n, k in PROJECTIONS:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            flops = 2 * m * n * k
            row = {"projection": name, "rows": m, "N": n, "K": k}
            reference = None
            for key, (library, fn) in variants(x, w).items():
                torch.backends.cuda.preferred_blas_library(library)
                got = fn()
                got = got.t() if key == "transposed" else got
                reference = got if reference is None else reference
                ms = median_ms(fn)
                row[key] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1),
                            "max_abs_diff": float((got.float() - reference.float()).abs().max())}
            torch.backends.cuda.preferred_blas_library("cublas")
            out.append(row)
            print(row, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="4096,8192")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = run([int(r) for r in args.rows.split(",")])
    results_io.write(args.out, {**results_io.header(), "projections": results})
    keys = ["linear", "cublaslt", "transposed"]
    print(f"{'projection':<12} {'rows':>5} " + " ".join(f"{k:>20}" for k in keys))
    for r in results:
        print(f"{r['projection']:<12} {r['rows']:>5} "
              + " ".join(f"{r[k]['ms']:>8.3f} ms {r[k]['tflops']:>5.0f} TF" for k in keys))


if __name__ == "__main__":
    main()
