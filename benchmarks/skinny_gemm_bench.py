"""The skinny GEMM (kernels/linear) against cuBLAS at the projections of the benchmark shapes, 1-16 rows,
bf16, on one GPU: time (CUDA-graph replays) and the bandwidth of reading the weight.

    python benchmarks/skinny_gemm_bench.py --out benchmarks/results/skinny_gemm.json

--split times the K-split variant (skinny_gemm_parts) at the weights short enough to take it, with
its default and SPLIT_SWEEP's (splits, tiles), beside the residual add-norm that sums its parts.
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
          ("35b lm_head", 248320, 2048), ("35b moe router", 264, 2048)]


# (block_n, block_k, stages, warps) for more than 16 rows: x's tile grows with the rows, so shorter K steps
TALL_TILES = [(32, 64, 4, 4), (32, 128, 3, 4), (64, 64, 4, 4), (64, 64, 3, 8), (16, 128, 4, 4), (32, 64, 6, 4),
              (128, 64, 3, 8), (64, 128, 3, 8)]


def sweep(x, weight, expected) -> list[dict]:
    n, k = weight.shape
    found = []
    for tiles in TALL_TILES:
        cfg = {"tiles": list(tiles)}
        try:
            out = skinny_gemm(x, weight, tiles).float()
            cfg["rel_err"] = round(((out - expected).norm() / expected.norm()).item(), 5)
            cfg["us"] = round(time_graph_us(lambda: skinny_gemm(x, weight, tiles)), 2)
            cfg["tb_s"] = round(n * k * 2 / cfg["us"] / 1e6, 2)
        except Exception as exc:  # a tile set the compiler rejects (shared memory) is skipped
            cfg["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        found.append(cfg)
    return found


# (splits, (block_n, block_k, stages, warps)) for skinny_gemm_parts; None: k_splits and SPLIT_TILES
SPLIT_SWEEP = [(2, (16, 256, 4, 4)), (4, (16, 256, 4, 4)), (8, (16, 256, 4, 4)), (4, (16, 512, 2, 4)),
               (4, (16, 1024, 1, 4)), (4, (32, 256, 4, 4)), (8, (16, 256, 2, 4)), (16, (16, 128, 2, 4)),
               (8, (32, 128, 4, 4)), (4, (16, 128, 4, 2)), (16, (16, 128, 4, 2)), (8, (16, 128, 4, 2))]


def split_rows(x, weight, expected) -> dict:
    """skinny_gemm_parts by default and over SPLIT_SWEEP; the add-norm's time with and without parts."""
    from deltaserve.kernels.linear.triton_skinny_gemm import k_splits, skinny_gemm_parts
    from deltaserve.kernels.norm.triton_rms_norm import add_rms_norm

    n, k = weight.shape
    found = {"default_splits": k_splits(n, k), "configs": []}
    for splits, tiles in [(None, None)] + SPLIT_SWEEP:
        cfg = {"splits": splits, "tiles": list(tiles) if tiles else None}
        try:
            out = skinny_gemm_parts(x, weight, splits, tiles).total().float()
            cfg["rel_err"] = round(((out - expected).norm() / expected.norm()).item(), 5)
            cfg["us"] = round(time_graph_us(lambda: skinny_gemm_parts(x, weight, splits, tiles)), 2)
            cfg["tb_s"] = round(n * k * 2 / cfg["us"] / 1e6, 2)
        except Exception as exc:
            cfg["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        found["configs"].append(cfg)
    residual, norm_w = torch.randn_like(expected).bfloat16(), torch.ones(n, device="cuda", dtype=torch.bfloat16)
    whole, parts = expected.bfloat16(), skinny_gemm_parts(x, weight)
    found["add_norm_us"] = round(time_graph_us(lambda: add_rms_norm(whole, residual, norm_w, 1e-6)), 2)
    found["add_norm_parts_us"] = round(time_graph_us(lambda: add_rms_norm(parts, residual, norm_w, 1e-6)), 2)
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,4,16", help="comma-separated row counts")
    ap.add_argument("--sweep", action="store_true", help="also time TALL_TILES at each shape")
    ap.add_argument("--split", action="store_true", help="only the shapes that split along K, with SPLIT_SWEEP")
    args = ap.parse_args()
    rows = []
    from deltaserve.kernels.linear.triton_skinny_gemm import k_splits

    for name, n, k in SHAPES:
        if args.split and k_splits(n, k) == 1:
            continue
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            expected = x.float() @ weight.float().T
            cublas = time_graph_us(lambda: torch.nn.functional.linear(x, weight))
            row = {"shape": name, "rows": m, "N": n, "K": k, "tiles": list(default_tiles(n)),
                   "cublas_us": round(cublas, 2), "cublas_tb_s": round(n * k * 2 / cublas / 1e6, 2)}
            try:  # the decode tiles (tall rows may need more shared memory than they leave)
                out = skinny_gemm(x, weight).float()
                skinny = time_graph_us(lambda: skinny_gemm(x, weight))
                row.update(rel_err=round(((out - expected).norm() / expected.norm()).item(), 5),
                           skinny_us=round(skinny, 2), skinny_tb_s=round(n * k * 2 / skinny / 1e6, 2))
            except Exception as exc:
                row["skinny_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            if args.split:
                row["split"] = split_rows(x, weight, expected)
            if args.sweep:
                row["sweep"] = sweep(x, weight, expected)
                best = min((c for c in row["sweep"] if "us" in c), key=lambda c: c["us"], default=None)
                row["best"] = best
            rows.append(row)
            print(row, flush=True)
    results_io.write(args.out, {**results_io.header(), "rows": rows})


if __name__ == "__main__":
    main()
