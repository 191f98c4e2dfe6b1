"""What a drafting engine's caches take at start-up: its KV blocks and the memory its verify rows hold, random
weights in a real shape, graphs off (they change no pool).

    python benchmarks/speculative_memory.py qwen3.5-9b --drafts 3 --max-num-seqs 256 \
        --out benchmarks/results/speculative_memory_qwen3.5-9b.json
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.arrival_step import pool_sizes  # noqa: E402
from benchmarks.shapes import dummy_engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--method", default="mtp")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    engine = dummy_engine(args.shape, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                          enforce_eager=True, with_head=args.method == "mtp",
                          speculative_config={"method": args.method, "num_speculative_tokens": args.drafts})
    result = {**results_io.header(), "shape": args.shape, "drafts": args.drafts, "method": args.method,
              "max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len, **pool_sizes(engine)}
    result["kv_tokens"] = result["kv_blocks"] * engine.config.block_size
    results_io.write(args.out, result)
    print(result)


if __name__ == "__main__":
    main()
