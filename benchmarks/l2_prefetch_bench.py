"""Does a decode step's small kernel, by prefetching into L2 the first bytes of every row of the weight
that the next GEMM reads, shorten that GEMM? Between two cuBLAS GEMMs of a decode step the memory is
idle while an RMSNorm or SiLU-and-mul runs (3-4 us each), and each GEMM starts by filling its pipeline
from memory.

    python benchmarks/l2_prefetch_bench.py --out benchmarks/results/l2_prefetch.json

One "layer" of the 9B shape's MLP: RMSNorm -> gate_up GEMM (24576 x 4096) -> SiLU-and-mul -> down GEMM
(4096 x 12288), the two small kernels as Triton kernels that may prefetch `bytes` at the start of each
row of the next weight (cp.async.bulk.prefetch.L2, one instruction a row). Eight layers with their own
weights (2.4 GB, far past the L2) in one CUDA graph, replayed; time per layer, for each prefetch size.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402

HIDDEN, INTER, LAYERS = 4096, 12288, 8


@triton.jit
def _prefetch_rows(w, rows, stride_row, nbytes, program, programs, BLOCK: tl.constexpr):
    """This program's share of the rows of w: the first `nbytes` of each into L2 (nothing when 0)."""
    per = tl.cdiv(rows, programs)
    first = program * per
    for r0 in range(first, first + per, BLOCK):
        r = r0 + tl.arange(0, BLOCK)
        ok = (r < rows) & (r < first + per) & (nbytes > 0)
        ptrs = w + tl.where(ok, r, 0).to(tl.int64) * stride_row
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; }\n mov.u32 $0, 0;",
            "=r,l,r,r", [ptrs, tl.full([BLOCK], 0, tl.int32) + nbytes, ok.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1)


@triton.jit
def _norm_kernel(x, out, w_next, rows_next, stride_next, nbytes, N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, N)
    v = tl.load(x + row * N + cols).to(tl.float32)
    v = v / tl.sqrt(tl.sum(v * v, 0) / N + 1e-6)
    tl.store(out + row * N + cols, v.to(out.dtype.element_ty))
    _prefetch_rows(w_next, rows_next, stride_next, nbytes, row, tl.num_programs(0), 128)


@triton.jit
def _silu_mul_kernel(x, out, w_next, rows_next, stride_next, nbytes, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    row, tile = tl.program_id(0), tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    gate = tl.load(x + row * 2 * WIDTH + cols).to(tl.float32)
    up = tl.load(x + row * 2 * WIDTH + WIDTH + cols).to(tl.float32)
    tl.store(out + row * WIDTH + cols, (gate / (1.0 + tl.exp(-gate)) * up).to(out.dtype.element_ty))
    program = row * tl.num_programs(1) + tile
    _prefetch_rows(w_next, rows_next, stride_next, nbytes, program, tl.num_programs(0) * tl.num_programs(1), 128)


def layer(x, w13, w2, nbytes):
    m = x.shape[0]
    h = torch.empty_like(x)
    _norm_kernel[(m,)](x, h, w13, w13.shape[0], w13.stride(0), nbytes, N=HIDDEN, num_warps=4)
    g = torch.mm(h, w13.T)
    a = torch.empty(m, INTER, dtype=x.dtype, device=x.device)
    _silu_mul_kernel[(m, INTER // 1024)](g, a, w2, w2.shape[0], w2.stride(0), nbytes, WIDTH=INTER, BLOCK=1024,
                                        num_warps=4)
    return torch.mm(a, w2.T)


def time_layers(x, weights, nbytes) -> float:
    """Microseconds a layer: every layer in one graph (kernels_check's timing), replayed."""
    from benchmarks.kernels_check import time_graph_us

    def step():
        y = x
        for w13, w2 in weights:
            y = layer(y, w13, w2, nbytes)
        return y
    return time_graph_us(step, calls=1) / len(weights)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="32,64,128")
    ap.add_argument("--bytes", default="0,256,512,1024,2048")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    weights = [(torch.randn(2 * INTER, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02,
                torch.randn(HIDDEN, INTER, device="cuda", dtype=torch.bfloat16) * 0.02) for _ in range(LAYERS)]
    floor_us = (2 * INTER * HIDDEN + HIDDEN * INTER) * 2 / 4.24e12 * 1e6
    result = {**results_io.header(), "floor_us_per_layer": round(floor_us, 2), "rows": []}
    sizes = [int(b) for b in args.bytes.split(",")]
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        expected = layer(x, *weights[0], 0)
        row = {"rows": m, "same_output": all(torch.equal(layer(x, *weights[0], b), expected) for b in sizes)}
        for rnd in range(2):  # every size twice, in turn
            for b in sizes:
                row.setdefault(f"us_{b}", []).append(round(time_layers(x, weights, b), 2))
        result["rows"].append(row)
        print(row, flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
