"""Chains of decode-step kernels replayed as CUDA graphs, before and after a library's start-up, one process
per trigger: which kernel boundaries lose what programmatic dependent launch (PDL) gained.

    python benchmarks/pdl_after_cudnn.py --rows 24 --out benchmarks/results/pdl_after_cudnn.json

In the engine, once cuDNN has started (cudnnCreate alone does it), the 9B shape's decode graph replays
about 0.11 ms slower at 24 and 32 rows, as slow as with PDL off, where cuBLAS runs the output and down
projections; at 16 rows, where the skinny Triton GEMM runs them, it loses 0.008 ms. Here each chain is
LAYERS times a projection of a 4096-wide bf16 weight (each layer its own, well past the L2 together) and the
residual add-norm (a Triton kernel launched with PDL), the pair of the engine's decode step:

- split: cuBLAS split along K (split_gemm_parts), the engine's path from 17 to 128 rows;
- whole: one cuBLAS GEMM;
- skinny: the skinny Triton GEMM's parts (a PDL kernel too);
- norms: the add-norm alone, back to back (Triton after Triton only);
- mlp: the 9B shape's MLP as the engine runs it from 17 rows (MLP_LAYERS of it).

`--hold-gib` makes each child hold that much device memory first, as the engine's KV and state pools do;
`--carveout` sets the chains' Triton kernels' preferred shared-memory carveout.

Each child process captures the chains, replays them back to back, runs the trigger, replays the same
graphs again and then fresh captures of them. `--trace` adds a CUPTI trace of a few replays of each
graph before and after the trigger: the gap from each kernel's end to the next one's start, averaged
over each kind of boundary (cuBLAS to Triton, Triton to cuBLAS, Triton to Triton).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.graph_timeline import gaps_by_kind, graph_boundaries, replay_us  # noqa: E402
from benchmarks.process_triggers import cublaslt_handle, cudnn_handle, cudnn_libraries, libcuda  # noqa: E402
from deltaserve.kernels.activation.triton_silu_and_mul import silu_and_mul  # noqa: E402
from deltaserve.kernels.linear.split_gemm import split_gemm_parts  # noqa: E402
from deltaserve.kernels.linear.triton_skinny_gemm import skinny_gemm_parts  # noqa: E402
from deltaserve.kernels.norm.triton_rms_norm import add_rms_norm  # noqa: E402
from deltaserve.runner.cuda_graphs import capture_graph  # noqa: E402

WIDTH = 4096
LAYERS = 48  # 48 x 32 MiB of weights: each replay reads them from memory, not from the L2
CHAINS = ("split", "whole", "skinny", "norms", "mlp")
MLP_WIDTH, MLP_LAYERS = 12288, 16  # 16 x 288 MiB
CU_FUNC_PREFERRED_CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
TRIGGERS = ("none", "cudnn-handle", "cudnn-libraries", "cublaslt-handle")


def run_trigger(name: str) -> dict:
    done: dict = {"trigger": name}
    if name == "cudnn-handle":
        cudnn_handle()
    elif name == "cudnn-libraries":
        done["libraries"] = cudnn_libraries()
    elif name == "cublaslt-handle":
        cublaslt_handle()
    torch.cuda.synchronize()
    return done


def norm_and_rows(rows: int):
    """The add-norm's weight, and the chain's input rows and residual rows."""
    norm_w = torch.ones(WIDTH, device="cuda", dtype=torch.bfloat16)
    x, residual = (torch.randn(rows, WIDTH, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return norm_w, x, residual


def mlp_chain(rows: int):
    """The 9B shape's MLP as the engine runs it from 17 rows: gate/up on cuBLAS, SiLU-and-multiply, the down
    projection split along K, the residual add-norm."""
    gate_up = [torch.randn(2 * MLP_WIDTH, WIDTH, device="cuda", dtype=torch.bfloat16) * WIDTH**-0.5
               for _ in range(MLP_LAYERS)]
    down = [torch.randn(WIDTH, MLP_WIDTH, device="cuda", dtype=torch.bfloat16) * MLP_WIDTH**-0.5
            for _ in range(MLP_LAYERS)]
    norm_w, x, residual = norm_and_rows(rows)

    def step():
        h, r = x, residual
        for w_gu, w_d in zip(gate_up, down):
            h, r = add_rms_norm(split_gemm_parts(silu_and_mul(h @ w_gu.t()), w_d, 2), r, norm_w, 1e-6)
        return h
    return step


def chain(kind: str, rows: int):
    """The chain's step as a function of no arguments, and its buffers kept alive with it."""
    if kind == "mlp":
        return mlp_chain(rows)
    weights = [torch.randn(WIDTH, WIDTH, device="cuda", dtype=torch.bfloat16) * WIDTH**-0.5 for _ in range(LAYERS)]
    norm_w, x, residual = norm_and_rows(rows)
    project = {"split": lambda h, w: split_gemm_parts(h, w, 2), "whole": lambda h, w: h @ w.t(),
               "skinny": skinny_gemm_parts, "norms": lambda h, w: h}[kind]

    def step():
        h, r = x, residual
        for w in weights:
            h, r = add_rms_norm(project(h, w), r, norm_w, 1e-6)
        return h
    return step


def capture(step) -> torch.cuda.CUDAGraph:
    return capture_graph(step, None)[0]


def set_carveout(percent: int) -> int:
    """The preferred shared-memory carveout (percent of the unified L1) of every compiled Triton kernel of
    the chains: an SM runs blocks of kernels with different carveouts together only after it drains.
    Returns how many kernels were set."""
    from deltaserve.kernels.activation import triton_silu_and_mul
    from deltaserve.kernels.linear import triton_skinny_gemm
    from deltaserve.kernels.norm import triton_rms_norm

    driver = libcuda()
    count = 0
    for fn in (triton_rms_norm._rms_norm_kernel, triton_silu_and_mul._silu_and_mul_kernel,
               triton_skinny_gemm._skinny_gemm_kernel):
        for cache in fn.device_caches.values():
            kernels = next(c for c in cache if isinstance(c, dict)).values()
            for kernel in kernels:
                kernel._init_handles()
                if driver.cuFuncSetAttribute(ctypes.c_void_p(kernel.function), CU_FUNC_PREFERRED_CARVEOUT,
                                             ctypes.c_int(percent)) != 0:
                    raise RuntimeError("cuFuncSetAttribute failed")
                count += 1
    return count


def child(trigger: str, rows: int, trace: bool, hold_gib: float, carveout: int | None) -> dict:
    held = torch.empty(int(hold_gib * 2**30), dtype=torch.uint8, device="cuda") if hold_gib else None
    steps = {kind: chain(kind, rows) for kind in CHAINS}
    if carveout is not None:
        for step in steps.values():
            step()  # compiled, so that their handles exist
    set_count = set_carveout(carveout) if carveout is not None else None
    graphs = {kind: capture(step) for kind, step in steps.items()}
    before = [{kind: replay_us(g) for kind, g in graphs.items()} for _ in range(2)]
    gaps_before = {kind: gaps_by_kind(graph_boundaries(g)) for kind, g in graphs.items()} if trace else None
    done = run_trigger(trigger)
    after = [{kind: replay_us(g) for kind, g in graphs.items()} for _ in range(2)]
    fresh = {kind: capture(step) for kind, step in steps.items()}
    after_fresh = {kind: replay_us(g) for kind, g in fresh.items()}
    gaps_after = {kind: gaps_by_kind(graph_boundaries(g)) for kind, g in graphs.items()} if trace else None
    del held  # held through every timing
    return {**done, "pdl": os.environ.get("DELTASERVE_PDL", "1") != "0", "rows": rows, "hold_gib": hold_gib,
            "carveout": carveout, "kernels_carveout_set": set_count,
            "replay_us_before": before,
            "replay_us_after": after, "replay_us_after_fresh_capture": after_fresh, "gaps_before": gaps_before,
            "gaps_after": gaps_after}


def table(runs: list[dict]) -> str:
    lines = [f"{'trigger':16} {'pdl':4} {'rows':>4} " + " ".join(f"{k:>22}" for k in CHAINS)]
    for r in runs:
        cells = []
        for k in CHAINS:
            b = min(p[k] for p in r["replay_us_before"])
            a = min(p[k] for p in r["replay_us_after"])
            cells.append(f"{b:8.1f}->{a:8.1f}/{r['replay_us_after_fresh_capture'][k]:6.0f}")
        lines.append(f"{r['trigger']:16} {str(r['pdl']):4} {r['rows']:>4} " + " ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="24", help="comma-separated row counts")
    ap.add_argument("--triggers", default=",".join(TRIGGERS), help=f"comma-separated, of {TRIGGERS}")
    ap.add_argument("--no-pdl-too", action="store_true", help="also run each trigger with DELTASERVE_PDL=0")
    ap.add_argument("--trace", action="store_true", help="CUPTI boundary gaps before and after each trigger")
    ap.add_argument("--hold-gib", type=float, default=0.0,
                    help="GiB of device memory each child holds before it builds its chains, as the engine's pools do")
    ap.add_argument("--carveout", type=int, default=None,
                    help="set this preferred shared-memory carveout (percent) on the chains' Triton kernels")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, int(args.rows), args.trace, args.hold_gib, args.carveout)))
        return
    runs = []
    for rows in [int(r) for r in args.rows.split(",")]:
        for trigger in args.triggers.split(","):
            for pdl in ("1", "0") if args.no_pdl_too else ("1",):
                cmd = [sys.executable, __file__, "--child", trigger, "--rows", str(rows)]
                cmd += ["--hold-gib", str(args.hold_gib)] + ["--trace"] * args.trace
                cmd += ["--carveout", str(args.carveout)] if args.carveout is not None else []
                out = subprocess.run(cmd, env={**os.environ, "DELTASERVE_PDL": pdl}, capture_output=True, text=True)
                if out.returncode != 0:
                    print(out.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"child {trigger} rows={rows} pdl={pdl} failed")
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(table(runs[-1:]).splitlines()[-1], flush=True)
    print(table(runs))
    if args.out:
        results_io.write(args.out, {**results_io.header(), "layers": LAYERS, "width": WIDTH, "runs": runs})


if __name__ == "__main__":
    main()
