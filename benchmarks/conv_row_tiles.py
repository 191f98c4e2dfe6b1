"""The conv1d row kernel's (rows, warps) a program against row_tiles_for's choice, from short passes to long.

    python benchmarks/conv_row_tiles.py --out benchmarks/results/conv1d_row_tiles_same_machine.json

At the Qwen3.5 GDN shape (8192 conv channels, x a strided view of the input projection's output, as the
engine's is, K=4), for one prompt of 96 to 8192 tokens and batches of 128-token prompts: the time of
causal_conv1d (the row kernel, then the per-sequence kernel that writes the states) at each of
(8..128 rows) x (1, 2 warps) with 256 channels a program, in CUDA-graph replays; each output equal to the
default tiles' (the tiles change only which program computes a row, not how).
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
from deltaserve.kernels.conv1d.triton_causal_conv1d import causal_conv1d, row_tiles_for  # noqa: E402

CHANNELS, IN_PROJ = 8192, 12352  # the conv's channels and the projection's row of the Qwen3.5 shapes
PASSES = [(1, 96), (1, 256), (1, 500), (1, 1000), (1, 2048), (16, 128), (1, 4096), (32, 128), (1, 8192),
          (128, 128)]
ROWS, WARPS = (8, 16, 32, 64, 128), (1, 2)


def sweep(seqs: int, length: int) -> dict:
    tokens = seqs * length
    x = torch.randn(tokens, IN_PROJ, device="cuda", dtype=torch.bfloat16)[:, :CHANNELS]
    weight = torch.randn(CHANNELS, 4, device="cuda", dtype=torch.bfloat16)
    state = torch.randn(seqs + 2, CHANNELS, 3, device="cuda", dtype=torch.bfloat16)
    slots = torch.arange(seqs, device="cuda", dtype=torch.int32) + 1
    starts = torch.arange(seqs + 1, device="cuda", dtype=torch.int32) * length
    expected = causal_conv1d(x, weight, state.clone(), slots, starts)
    default = row_tiles_for(tokens, CHANNELS)
    configs = []
    for rows, warps in itertools.product(ROWS, WARPS):
        tiles = (rows, 256, warps)
        same = torch.equal(causal_conv1d(x, weight, state.clone(), slots, starts, row_tiles=tiles), expected)
        scratch = state.clone()
        us = time_graph_us(lambda: causal_conv1d(x, weight, scratch, slots, starts, row_tiles=tiles))
        configs.append({"rows": rows, "warps": warps, "us": round(us, 2), "equal_to_default": same})
    configs.sort(key=lambda c: c["us"])
    return {"prompts": seqs, "length": length, "default": list(default),
            "default_us": next(c["us"] for c in configs if (c["rows"], 256, c["warps"]) == default),
            "floor_us": round(tokens * CHANNELS * 2 * 2 / 4.24e6, 1), "configs": configs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {**results_io.header(), "passes": []}
    for seqs, length in PASSES:
        row = sweep(seqs, length)
        result["passes"].append(row)
        results_io.write(args.out, result)
        best = row["configs"][0]
        print(f"{seqs:4d} x {length:5d}: default {row['default'][0]:3d} rows {row['default'][2]} warps "
              f"{row['default_us']:7.1f} us | best {best['rows']:3d} / {best['warps']} {best['us']:7.1f} us | "
              f"floor {row['floor_us']:6.1f}", flush=True)


if __name__ == "__main__":
    main()
