"""Where a long prefill's time goes: the CUDA kernels of one prompt's first token, by total time.

    python benchmarks/profile_prefill.py qwen3.5-35b-a3b --tokens 8192 --out benchmarks/results/profile_prefill_SHAPE.json
    python benchmarks/profile_prefill.py qwen3.5-9b --tokens 128 --prompts 128 --out ...   (a closed batch's prefill)

The engine is the one engine_bench.py measures prefill on (random weights, no prefix cache, the whole
batch in one pass). Each length runs once to compile its kernels, once timed, once under the profiler.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.engine_bench import run_batch  # noqa: E402
from benchmarks.profile_steps import kernel_table  # noqa: E402
from benchmarks.shapes import dummy_engine, random_tokens  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--tokens", default="8192", help="prompt lengths, comma-separated")
    ap.add_argument("--prompts", type=int, default=1, help="prompts of each length, prefilled together")
    ap.add_argument("--rows", type=int, default=40, help="rows of each kernel table")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    lengths = [int(n) for n in args.tokens.split(",")]
    batch = args.prompts
    engine = dummy_engine(args.shape, max_num_seqs=batch, max_num_batched_tokens=max(lengths) * batch,
                          max_model_len=max(lengths) + 256, enable_prefix_caching=False)
    tokens = random_tokens(engine.model_config.vocab_size)
    result = {**results_io.header(), "shape": args.shape, "prefill": []}
    for n in lengths:
        prompts = lambda: [tokens(n) for _ in range(batch)]  # noqa: E731
        run_batch(engine, prompts(), 1)  # compiles this length's kernels
        ttft = run_batch(engine, prompts(), 1)["prefill_s"]
        table = kernel_table(lambda: run_batch(engine, prompts(), 1), args.rows)
        result["prefill"].append({"tokens": n, "prompts": batch, "ttft_s": round(ttft, 4), "kernels": table})
        print(f"{args.shape} {batch} x {n} tokens: {ttft * 1e3:.1f} ms", flush=True)
        for row in table:
            if not row["name"].startswith("HOST"):
                print(f"  {row['ms']:9.3f} ms {row['calls']:6d}  {row['name']}", flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
