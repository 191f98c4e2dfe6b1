"""cuBLAS split along K at decode batches of 32-128 rows, against cuBLAS whole, bf16, on one GPU.

    python benchmarks/split_gemm_bench.py --rows 32,64,128 --out benchmarks/results/split_gemm.json

At these rows cuBLAS runs a projection as few output tiles, too few programs to read the weight at
the memory's bandwidth (the 9B shape's 4096 x 4096 out projection took 15.2 us at 128 rows against a
7.9 us floor). A strided batched GEMM over S slices of K gives it S times the programs; its fp32
parts are the PartialSums that the residual add-norm adds up as it loads them. Each case cycles over
copies of the weight larger than the L2 together, as a decode step reads every weight once. Also the
logits: the lm_head's bf16 result cast to fp32 against cuBLAS writing fp32 itself (out_dtype).

--skinny also times the skinny GEMM (kernels/linear) on the same cycled copies, whole over SKINNY_TILES
and, for the weights whose consumer takes PartialSums, split along K over SKINNY_SPLITS: which of the
four reads each weight fastest above the skinny GEMM's own rows.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernels_check import time_graph_us  # noqa: E402
from deltaserve.kernels.linear.split_gemm import split_gemm_parts  # noqa: E402
from deltaserve.kernels.norm.triton_rms_norm import add_rms_norm  # noqa: E402

# (name, N, K, feeds the add-norm): the weights a decode step reads in the Qwen3.5-9B and -35B-A3B shapes
SHAPES = [("9b out / o_proj", 4096, 4096, True), ("9b down", 4096, 12288, True),
          ("9b gate_up", 24576, 4096, False), ("9b gdn in_proj", 12352, 4096, False),
          ("9b attention qkv", 10240, 4096, False), ("35b out / o_proj", 2048, 4096, True),
          ("35b gdn in_proj", 12352, 2048, False), ("35b attention qkv", 9216, 2048, False)]
LM_HEADS = [("9b lm_head", 248320, 4096), ("35b lm_head", 248320, 2048)]
SPLITS = (2, 3, 4, 8)
# (block_n, block_k, stages, warps) of the skinny GEMM at more than 16 rows, and (splits, tiles) of its parts
SKINNY_TILES = [(32, 128, 6, 4), (32, 128, 3, 4), (32, 256, 3, 4), (64, 64, 4, 4), (64, 128, 3, 4), (16, 256, 4, 4)]
SKINNY_SPLITS = [(2, (32, 128, 4, 4)), (2, (32, 256, 3, 4)), (4, (32, 128, 4, 4)), (4, (16, 256, 4, 4)),
                 (2, (16, 512, 3, 4))]
COPIES_BYTES = 512 << 20  # the weight copies a case cycles over: well past the L2


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    count = max(2, -(-COPIES_BYTES // (n * k * 2)))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(count)]


def cycled_us(op, weights: list[torch.Tensor]) -> float:
    """Per call, over a graph that calls op once on each copy."""
    turn = [0]

    def call():
        op(weights[turn[0] % len(weights)])
        turn[0] += 1
    return time_graph_us(lambda: [call() for _ in weights], calls=1) / len(weights)


def skinny_configs(x: torch.Tensor, weights: list[torch.Tensor], expected: torch.Tensor, feeds_norm: bool) -> list:
    """The skinny GEMM whole over SKINNY_TILES and (feeds_norm) its parts over SKINNY_SPLITS, cycled."""
    from deltaserve.kernels.linear.triton_skinny_gemm import skinny_gemm, skinny_gemm_parts

    configs = [(None, tiles) for tiles in SKINNY_TILES] + (SKINNY_SPLITS if feeds_norm else [])
    found = []
    for splits, tiles in configs:
        cfg = {"splits": splits, "tiles": list(tiles)}
        op = (functools.partial(skinny_gemm, x, tiles=tiles) if splits is None
              else functools.partial(skinny_gemm_parts, x, splits=splits, tiles=tiles))
        try:
            out = op(weights[0])
            out = (out.total() if splits else out).float()
            cfg["rel_err"] = round(((out - expected).norm() / expected.norm()).item(), 5)
            cfg["us"] = round(cycled_us(op, weights), 2)
        except Exception as exc:  # a tile set the compiler rejects (shared memory) is skipped
            cfg["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        found.append(cfg)
    return found


def case(name: str, n: int, k: int, feeds_norm: bool, rows: int, skinny: bool = False) -> dict:
    weights = weight_copies(n, k)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    expected = x.float() @ weights[0].float().T
    floor_us = n * k * 2 / 4.24e6
    row = {"shape": name, "rows": rows, "N": n, "K": k, "floor_us": round(floor_us, 2),
           "cublas_us": round(cycled_us(lambda w: torch.mm(x, w.T), weights), 2), "splits": []}
    for splits in SPLITS:
        if k % splits or (k // splits) % 8:
            continue
        err = (split_gemm_parts(x, weights[0], splits).total().float() - expected).norm() / expected.norm()
        us = cycled_us(lambda w: split_gemm_parts(x, w, splits), weights)
        row["splits"].append({"splits": splits, "us": round(us, 2), "rel_err": round(err.item(), 5)})
    if skinny:
        row["skinny"] = skinny_configs(x, weights, expected, feeds_norm)
    if feeds_norm:  # what the consumer pays for reading parts instead of one bf16 result
        residual = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        norm_w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
        whole = expected.bfloat16()
        row["add_norm_us"] = round(time_graph_us(lambda: add_rms_norm(whole, residual, norm_w, 1e-6)), 2)
        for splits in (2, 4):
            parts = split_gemm_parts(x, weights[0], splits)
            row[f"add_norm_parts{splits}_us"] = round(
                time_graph_us(lambda: add_rms_norm(parts, residual, norm_w, 1e-6)), 2)
    del weights
    torch.cuda.empty_cache()
    return row


def lm_head_case(name: str, n: int, k: int, rows: int) -> dict:
    weights = weight_copies(n, k)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    same = torch.equal(torch.mm(x, weights[0].T).float(), torch.mm(x, weights[0].T, out_dtype=torch.float32)
                       .bfloat16().float())
    row = {"shape": name, "rows": rows, "N": n, "K": k, "floor_us": round(n * k * 2 / 4.24e6, 2),
           "bf16_then_cast_us": round(cycled_us(lambda w: torch.mm(x, w.T).float(), weights), 2),
           "bf16_us": round(cycled_us(lambda w: torch.mm(x, w.T), weights), 2),
           "fp32_out_us": round(cycled_us(lambda w: torch.mm(x, w.T, out_dtype=torch.float32), weights), 2),
           "fp32_out_rounds_to_bf16_result": same}
    del weights
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="32,64,128")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "split_gemm.json"))
    ap.add_argument("--skinny", action="store_true", help="also the skinny GEMM, whole and split")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    result = results_io.header() | {"cases": [], "lm_head": []}
    for m in rows:
        for name, n, k, feeds_norm in SHAPES:
            result["cases"].append(case(name, n, k, feeds_norm, m, args.skinny))
            r = result["cases"][-1]
            best = min(r["splits"], key=lambda s: s["us"])
            line = (f"{name:18s} M={m:3d} floor {r['floor_us']:7.2f} cublas {r['cublas_us']:7.2f} "
                    f"best split {best['splits']} {best['us']:7.2f} us")
            if args.skinny:
                fast = min((c for c in r["skinny"] if "us" in c), key=lambda c: c["us"])
                line += f"  skinny {fast['splits']} {fast['tiles']} {fast['us']:7.2f} us"
            print(line, flush=True)
        for name, n, k in LM_HEADS:
            result["lm_head"].append(lm_head_case(name, n, k, m))
            print(result["lm_head"][-1], flush=True)
    results_io.write(args.out, result)


if __name__ == "__main__":
    main()
