"""Beam search on one GPU, random weights in a real shape (Qwen3.5-9B by default): what each step costs when a
beam's request restores its parent's tail from the prefix cache, against the same search with the cache off
(every step recomputes every beam whole) and against sampling as many sequences for as many tokens.

    python benchmarks/beam_search_bench.py qwen3.5-9b --out benchmarks/results/beam_search_SHAPE.json

PROMPTS prompts of PROMPT_LEN tokens, width WIDTH, TOKENS tokens (ignore_eos: every search runs them all).
The engine's counters give the prompt tokens each run computed (its requests' prompts less their cached part).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.shapes import allow_long_max_model_len, random_tokens, write_shape  # noqa: E402
from deltaserve import LLM, BeamSearchParams, SamplingParams  # noqa: E402

PROMPTS, PROMPT_LEN, WIDTH, TOKENS = 4, 1024, 4, 64


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(llm: LLM, run) -> tuple[float, int, object]:
    """(seconds, prompt tokens computed, result) of run(llm), from a cold prefix cache."""
    llm.reset_prefix_cache()
    before = copy.copy(llm.engine.stats())  # the engine updates its object in place
    sync()
    start = time.perf_counter()
    result = run(llm)
    sync()
    seconds = time.perf_counter() - start
    after = llm.engine.stats()
    computed = (after.prompt_tokens_total - before.prompt_tokens_total) - (
        after.prompt_tokens_cached_total - before.prompt_tokens_cached_total)
    return seconds, computed, result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", default="qwen3.5-9b")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    allow_long_max_model_len()
    path = write_shape(args.shape, tempfile.mkdtemp())
    tokens = random_tokens(1000, seed=0)
    prompts = [{"prompt_token_ids": tokens(PROMPT_LEN)} for _ in range(PROMPTS)]
    beams = BeamSearchParams(beam_width=WIDTH, max_tokens=TOKENS, ignore_eos=True)
    short = BeamSearchParams(beam_width=WIDTH, max_tokens=TOKENS // 4, ignore_eos=True)
    sampled = SamplingParams(n=WIDTH, max_tokens=TOKENS, temperature=1.0, seed=0, ignore_eos=True)
    rows = {}
    for cached in (True, False):
        llm = LLM(path, load_format="dummy", max_num_seqs=PROMPTS * WIDTH, max_model_len=4096,
                  enable_prefix_caching=cached)
        llm.beam_search(prompts[:1], BeamSearchParams(beam_width=WIDTH, max_tokens=4, ignore_eos=True))  # warm-up
        params = beams if cached else short  # without the cache a step costs a whole prefill a beam
        seconds, computed, out = timed(llm, lambda m: m.beam_search(prompts, params))
        assert all(len(s.tokens) == PROMPT_LEN + params.max_tokens for o in out for s in o.sequences)
        rows["beam_search_cached" if cached else "beam_search_uncached"] = {
            "seconds": round(seconds, 4), "steps": params.max_tokens,
            "ms_per_step": round(1000 * seconds / params.max_tokens, 3), "prompt_tokens_computed": computed}
        if cached:
            seconds, computed, _ = timed(llm, lambda m: m.generate(prompts, sampled, use_tqdm=False))
            rows["sampled_n"] = {"seconds": round(seconds, 4), "steps": TOKENS,
                                 "ms_per_step": round(1000 * seconds / TOKENS, 3), "prompt_tokens_computed": computed}
        del llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result = {**results_io.header(), "shape": args.shape, "prompts": PROMPTS, "prompt_len": PROMPT_LEN,
              "beam_width": WIDTH, "tokens": TOKENS, "rows": rows}
    results_io.write(args.out, result)
    print(f"{'run':<22}{'steps':>6}{'seconds':>10}{'ms/step':>10}{'prompt tokens computed':>25}")
    for name, row in rows.items():
        print(f"{name:<22}{row['steps']:>6}{row['seconds']:>10}{row['ms_per_step']:>10}"
              f"{row['prompt_tokens_computed']:>25}")


if __name__ == "__main__":
    main()
