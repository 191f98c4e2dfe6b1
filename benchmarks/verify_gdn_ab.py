"""The gated delta rule of a speculative verify pass, by algorithm, in the engine on one GPU (random weights in a
real shape, Qwen3.5-9B by default, given one MTP layer).

A verify pass is n sequences of k + 1 rows. Variants, each an engine of its own (its graphs captured with it):
- chunk: the chunk kernels, chosen by the pass's row count alone (how passes of more than 16 rows ran before
  the longest chunk was taken into account);
- loop_8x1: the token loop of triton_recurrent, chosen by the longest sequence, at the tiles of a few
  sequences' latency-bound pass (8 columns, one warp);
- loop_16x2, loop_32x4: the same with wider tiles and more warps where the pass has 256 (sequence, value head)
  pairs or more;
- loop: the token loop at triton_recurrent.ragged_tiles' choice.
Each variant's step parts are timed as speculative_step_times.py times them.

    python benchmarks/verify_gdn_ab.py qwen3.5-9b --out benchmarks/results/verify_gdn_ab_SHAPE.json
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.speculative_bench import PROMPT_LEN, TOKENS, closed_batch_inputs  # noqa: E402
from benchmarks.speculative_step_times import timed_batches  # noqa: E402
from deltaserve import LLM, kernels  # noqa: E402
from deltaserve.kernels.gdn import triton_recurrent  # noqa: E402

VARIANTS = ("chunk", "loop_8x1", "loop_16x2", "loop_32x4", "loop")


def apply(variant: str) -> None:
    """Sets the dispatch the next engine's graphs capture."""
    kernels.chunk_gated_delta_rule = _chunk_by_rows if variant == "chunk" else _BY_LONGEST
    wide = {"loop_8x1": (8, 1, False), "loop_16x2": (16, 2, False), "loop_32x4": (32, 4, False)}.get(variant)
    triton_recurrent.ragged_tiles = (lambda n, b: wide if n >= 256 else _RAGGED(n, b)) if wide else _RAGGED


_BY_LONGEST = kernels.chunk_gated_delta_rule
_RAGGED = triton_recurrent.ragged_tiles


def _chunk_by_rows(*args, longest_chunk=None, **kwargs):
    return _BY_LONGEST(*args, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", default="qwen3.5-9b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--drafts", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    path, prompts, params, engine = closed_batch_inputs(args.shape, concurrency)
    engine["speculative_config"] = {"method": "mtp", "num_speculative_tokens": args.drafts}
    result = {**results_io.header(), "shape": args.shape, "prompt_len": PROMPT_LEN, "tokens": TOKENS,
              "num_speculative_tokens": args.drafts, "variants": {}}
    for variant in args.variants.split(","):
        apply(variant)
        llm = LLM(path, **engine)
        print(variant, flush=True)
        result["variants"][variant] = timed_batches(llm, concurrency, prompts, params)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        results_io.write(args.out, result)
    apply("loop")
    summary = {v: {r["concurrency"]: r["parts"].get("verify_graph", {}).get("median_ms")
                   for r in rows} for v, rows in result["variants"].items()}
    result["verify_graph_median_ms"] = summary
    results_io.write(args.out, result)
    print(summary)


if __name__ == "__main__":
    main()
