"""The chunked-GDN state kernel's tiles, stages and warps on one GPU, timed alone and as inside a prefill
pass, where each GDN layer's kernels follow the input projection's GEMM and the MLP's before it: the
kernel took 393 us a layer inside a Qwen3.5-9B 8192-token pass, 258 us timed alone and 340 after forty
GEMMs, which hold the card at its power limit and its SM clock near 1500 MHz (gdn_state_tiles_heat.json).

    python benchmarks/gdn_state_tiles.py --out benchmarks/results/gdn_state_tiles.json

Per shape and configuration: each chunk kernel's device time (the profiler's mean over 5 calls) alone,
after one GEMM of the MLP's shape ([tokens, 4096] x [4096, 24576], bf16) before each call and after
`--heat` of them; the SM clock and power that nvidia-smi samples meanwhile; and the largest difference
of the output and of the final states from the default configuration's (the state columns are
independent, so a tiling should change no byte).
"""

import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.gdn_prefill_kernels import packed_inputs  # noqa: E402
from benchmarks.kernel_times import per_kernel_us  # noqa: E402
from deltaserve.kernels.gdn import triton_chunk  # noqa: E402

HIDDEN, MLP = 4096, 24576  # the Qwen3.5-9B MLP's gate and up projection


def configs(spec: str) -> list[dict]:
    """'bv:stages:warps,...' -> option dicts; 'default' for the kernels' own choice."""
    out = []
    for item in spec.split(","):
        if item == "default":
            out.append({})
        else:
            bv, stages, warps = (int(x) for x in item.split(":"))
            out.append({"block_v": bv, "num_stages": stages, "num_warps": warps})
    return out


class ClockSamples:
    """nvidia-smi's SM clock and power every 10 ms while the block runs: their spread (None where
    nvidia-smi cannot run)."""

    def __enter__(self):
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                                          "--format=csv,noheader,nounits", "-lms", "10"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
        return self

    def __exit__(self, *exc):
        self.summary = None
        if self.proc is None:
            return
        self.proc.terminate()
        rows = []
        for line in self.proc.communicate()[0].splitlines():
            try:
                rows.append([float(x) for x in line.split(",")])
            except ValueError:
                continue
        if rows:
            clocks = sorted(r[0] for r in rows)
            self.summary = {"samples": len(rows), "sm_mhz_min": clocks[0], "sm_mhz_median": clocks[len(clocks) // 2],
                            "power_w_max": max(r[1] for r in rows)}


def measure(tokens: int, seqs: int, options: list[dict], heat: int) -> list[dict]:
    q, k, v, a, b, A_log, dt_bias, pool0, slots, starts = packed_inputs(tokens, seqs)
    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, MLP, device="cuda", dtype=torch.bfloat16) * HIDDEN**-0.5

    def run(pool, opts):
        return triton_chunk.chunk_gdn(q, k, v, a, b, A_log, dt_bias, pool, slots, starts, **opts)

    reference_pool = pool0.clone()
    reference = run(reference_pool, {})
    rows = []
    for opts in options:
        pool = pool0.clone()
        out = run(pool, opts)
        row = {"options": opts or "default",
               "max_abs_diff_output": float((out.float() - reference.float()).abs().max()),
               "max_abs_diff_state": float((pool - reference_pool).abs().max())}
        for label, gemms in (("alone", 0), ("after_gemm", 1), (f"after_{heat}_gemms", heat)):
            scratch = pool0.clone()

            def call():
                for _ in range(gemms):
                    x @ w
                run(scratch, opts)

            with ClockSamples() as clocks:
                times = per_kernel_us(call, calls=5)
            row[label] = {name[:40]: us for name, us in times.items() if us >= 1.0}
            row[label]["clocks"] = clocks.summary
        rows.append(row)
        print(tokens, seqs, row, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x1,32768x1,16384x128", help="tokens x sequences, comma-separated")
    ap.add_argument("--configs", default="default,16:2:4,16:3:4,32:2:4,32:3:4,64:2:4,16:2:2,32:3:8")
    ap.add_argument("--heat", type=int, default=40, help="GEMMs before each call in the third timing")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {**results_io.header(), "shapes": args.shapes, "rows": {}}
    for shape in args.shapes.split(","):
        tokens, seqs = (int(n) for n in shape.split("x"))
        result["rows"][shape] = measure(tokens, seqs, configs(args.configs), args.heat)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
