"""Speculative decoding with the MTP head on one GPU, random weights in a real shape (Qwen3.5-9B by default, its
config given one MTP layer), against plain decoding (its graphs) at the same concurrency.

Random weights make the head's drafts as good as chance, so two kinds of drafts are timed:
- the head's own: almost all refuted, so a step yields one token and costs a verify pass of k + 1 rows a sequence
  and the head's passes (what drafting costs where nothing is kept);
- drafts read off plain greedy decoding's output of the same prompts, wherever a sequence's output so far is that
  output (the head's own elsewhere): kept as far as the verify pass's rounding agrees with plain decoding's, near
  the most a step can yield. A real checkpoint's head lies between.

Closed batches of C prompts of PROMPT_LEN tokens, TOKENS generated greedily (ignore_eos), after a warm-up batch at
the same C; tok/s counts generated tokens over the batch's whole time (its prefill included, as the engine
benchmarks' closed batches do).

    python benchmarks/speculative_bench.py qwen3.5-9b --out benchmarks/results/speculative_SHAPE.json
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.shapes import allow_long_max_model_len, random_tokens, write_shape_with_head  # noqa: E402
from deltaserve import LLM, SamplingParams  # noqa: E402
from tests.read_off_drafts import read_off_drafts  # noqa: E402

PROMPT_LEN, TOKENS = 128, 128


def closed_batch_inputs(shape: str, concurrency: list[int]) -> tuple[str, dict, SamplingParams, dict]:
    """The speculative benchmarks' inputs: the shape written with an MTP head, each concurrency's prompts, greedy
    sampling of TOKENS tokens, and the engine arguments (random weights, room for every sequence)."""
    allow_long_max_model_len()
    path = write_shape_with_head(shape, tempfile.mkdtemp())
    tokens = random_tokens(1000, seed=0)
    prompts = {c: [{"prompt_token_ids": tokens(PROMPT_LEN)} for _ in range(c)] for c in concurrency}
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    return path, prompts, params, dict(load_format="dummy", max_num_seqs=max(concurrency), max_model_len=1024)


CONCURRENCY = (1, 8, 32)
DRAFTS = (1, 2)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def closed_batch(llm: LLM, prompts, params) -> tuple[float, list[list[int]]]:
    llm.generate(prompts, params, use_tqdm=False)  # warm-up at this concurrency
    sync()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outs]


def measured(llm: LLM, prompts, params) -> tuple[dict, list[list[int]]]:
    before = llm.engine.stats()
    drafted, kept, verifies = (before.spec_decode_num_draft_tokens, before.spec_decode_num_accepted_tokens,
                               before.spec_decode_num_drafts)
    seconds, outputs = closed_batch(llm, prompts, params)
    after = llm.engine.stats()
    generated = sum(len(o) for o in outputs)
    row = {"seconds": round(seconds, 4), "tok_s": round(generated / seconds, 1)}
    if after.spec_decode_num_drafts > verifies:
        # the counters span the warm-up batch and the timed one: the same work twice
        row["kept_share"] = round((after.spec_decode_num_accepted_tokens - kept)
                                  / max(1, after.spec_decode_num_draft_tokens - drafted), 3)
    return row, outputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", default="qwen3.5-9b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument("--drafts", default=",".join(map(str, DRAFTS)), help="the num_speculative_tokens to run")
    args = ap.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    draft_counts = [int(k) for k in args.drafts.split(",")]
    path, prompts, params, engine = closed_batch_inputs(args.shape, concurrency)
    result = {**results_io.header(), "shape": args.shape, "prompt_len": PROMPT_LEN, "tokens": TOKENS, "rows": []}
    llm = LLM(path, **engine)
    plain = {}
    for c in concurrency:
        row, plain[c] = measured(llm, prompts[c], params)
        result["rows"].append({"concurrency": c, "drafts": 0, **row})
        print(result["rows"][-1], flush=True)
    del llm
    for k in draft_counts:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        llm = LLM(path, speculative_config={"method": "mtp", "num_speculative_tokens": k}, **engine)
        for c in concurrency:
            row, outputs = measured(llm, prompts[c], params)
            result["rows"].append({"concurrency": c, "drafts": k, "kind": "head", **row,
                                   "same_as_plain": outputs == plain[c]})
            print(result["rows"][-1], flush=True)
        read_off_drafts(llm, [p["prompt_token_ids"] for c in concurrency for p in prompts[c]],
                        [o for c in concurrency for o in plain[c]], right_chance=1.0)
        for c in concurrency:
            row, outputs = measured(llm, prompts[c], params)
            result["rows"].append({"concurrency": c, "drafts": k, "kind": "read_off_plain", **row,
                                   "same_as_plain": outputs == plain[c]})
            print(result["rows"][-1], flush=True)
        del llm
        results_io.write(args.out, result)
    results_io.write(args.out, result)


if __name__ == "__main__":
    main()
