"""Wall time of one chunked-GDN prefill call in segments of chunks (triton_chunk's `segments`), on one GPU.

    python benchmarks/gdn_segments.py --shapes 8192x1,32768x1 --segments 1,2,4,8 --out results/gdn_segments.json

The segments overlap the state kernel's serial chain with the other segments' prepare and output kernels
on three streams (segmented_launch.py), so the profiler's per-kernel sums do not show the gain: this times
the call from its first launch to the end of its last, with CUDA events, the median of `--calls` calls in
the order given, rounds alternated. Every count of segments is checked against one segment, byte for byte
(the output and the state pool).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.gdn_prefill_kernels import packed_inputs  # noqa: E402
from deltaserve.kernels.gdn.triton_chunk import chunk_gdn  # noqa: E402


def call_us(inputs, segments: int, calls: int) -> float:
    q, k, v, a, b, A_log, dt_bias, pool, slots, starts = inputs
    times = []
    for _ in range(calls):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        chunk_gdn(q, k, v, a, b, A_log, dt_bias, pool, slots, starts, segments=segments)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    return statistics.median(times)


def same_bytes(inputs, segments: int) -> bool:
    q, k, v, a, b, A_log, dt_bias, pool, slots, starts = inputs
    outs = []
    for n in (1, segments):
        state = pool.clone()
        outs.append((chunk_gdn(q, k, v, a, b, A_log, dt_bias, state, slots, starts, segments=n), state))
    return all(torch.equal(x, y) for x, y in zip(*outs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x1,32768x1,16384x2", help="tokens x sequences")
    ap.add_argument("--segments", default="1,2,4,8")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    counts = [int(n) for n in args.segments.split(",")]
    result = {**results_io.header(), "rows": []}
    for shape in args.shapes.split(","):
        tokens, seqs = (int(n) for n in shape.split("x"))
        torch.manual_seed(tokens + seqs)
        inputs = packed_inputs(tokens, seqs)
        row = {"tokens": tokens, "seqs": seqs, "same_bytes": {n: same_bytes(inputs, n) for n in counts if n > 1},
               "us": {n: [] for n in counts}}
        for round_ in range(args.rounds):
            for n in counts if round_ % 2 == 0 else counts[::-1]:
                row["us"][n].append(round(call_us(inputs, n, args.calls), 1))
        result["rows"].append(row)
        print(row, flush=True)
        results_io.write(args.out, result)
    print(f"{'shape':>10} " + " ".join(f"{n:>14}" for n in counts))
    for row in result["rows"]:
        print(f"{row['tokens']}x{row['seqs']:<4} " + " ".join(f"{'/'.join(str(t) for t in row['us'][n]):>14}"
                                                        for n in counts))


if __name__ == "__main__":
    main()
