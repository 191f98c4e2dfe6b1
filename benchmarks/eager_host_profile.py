"""Where an eager prefill pass spends the host's time: one prompt's first token with graphs off, timed, then
under cProfile (the Python functions by their own time and by their time with callees).

    python benchmarks/eager_host_profile.py qwen3.5-35b-a3b --tokens 128,1024 --out benchmarks/results/eager_host.json

The engine is engine_bench.py's (random weights, no prefix cache) with enforce_eager, so every pass is
launched kernel by kernel from the host, as the passes no prefill graph holds are. cProfile slows the
host, so its table says where the time goes, not how long the pass takes: ttft_s is timed without it.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.engine_bench import run_batch, sync  # noqa: E402
from benchmarks.shapes import dummy_engine, random_tokens  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402


def profiled_step(engine, prompt: list[int]) -> tuple[float, pstats.Stats]:
    """The step that prefills `prompt`, under cProfile up to the GPU's end of it; then the request is run out."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, detokenize=False)
    engine.add_request(f"host{time.monotonic_ns()}", prompt, params)
    sync()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    engine.step()
    sync()
    profiler.disable()
    wall = time.perf_counter() - start
    while engine.has_unfinished_requests():
        engine.step(final_only=True)
    return wall, pstats.Stats(profiler)


def table(stats: pstats.Stats, key: int, rows: int) -> list[dict]:
    """The `rows` functions with the most time by stats' column `key` (2: own time, 3: with callees)."""
    entries = sorted(stats.stats.items(), key=lambda item: -item[1][key])[:rows]
    return [{"function": f"{os.path.basename(path)}:{line}({name})", "calls": calls, "own_ms": round(own * 1e3, 3),
             "cumulative_ms": round(cum * 1e3, 3)} for (path, line, name), (_, calls, own, cum, _) in entries]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--tokens", default="128,1024", help="prompt lengths, comma-separated")
    ap.add_argument("--passes", type=int, default=4, help="timed passes at each length, after two warm-ups")
    ap.add_argument("--rows", type=int, default=30, help="rows of each table")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    lengths = [int(n) for n in args.tokens.split(",")]
    engine = dummy_engine(args.shape, max_num_seqs=1, max_num_batched_tokens=max(lengths),
                          max_model_len=max(lengths) + 256, enable_prefix_caching=False, enforce_eager=True)
    tokens = random_tokens(engine.model_config.vocab_size)
    result = {**results_io.header(), "shape": args.shape, "prefill": []}
    for n in lengths:
        for _ in range(2):
            run_batch(engine, [tokens(n)], 1)
        ttfts = [round(run_batch(engine, [tokens(n)], 1)["prefill_s"], 4) for _ in range(args.passes)]
        wall, stats = profiled_step(engine, tokens(n))
        entry = {"tokens": n, "ttft_s": ttfts, "profiled_step_s": round(wall, 4),
                 "by_own_time": table(stats, 2, args.rows), "by_cumulative_time": table(stats, 3, args.rows)}
        result["prefill"].append(entry)
        print(f"{args.shape} {n} tokens eager: ttft {ttfts} s, profiled step {wall * 1e3:.1f} ms", flush=True)
        for row in entry["by_own_time"][:args.rows]:
            print(f"  own {row['own_ms']:8.2f} cum {row['cumulative_ms']:8.2f} ms {row['calls']:6d}  {row['function']}",
                  flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
