"""Prefix caching on one GPU, random weights in a real shape (Qwen3.5-35B-A3B by default).

    python benchmarks/prefix_cache_bench.py qwen3.5-35b-a3b --out benchmarks/results/prefix_cache_SHAPE.json

1. Follow-up turn: a first turn with an 8k-token history generates a reply; the second turn sends
   history + reply + a new 64-token message. Time to first token of that second turn warm (the
   first turn's blocks and GDN snapshots cached) against the same prompt cold (cache reset), and
   the tokens each turn recomputed.
2. Eight requests sharing a 2k-token prefix with different 64-token endings, sent together: total
   prefill time (until all eight have their first token) warm (prefix cached by an earlier request)
   against cold.
Each time is the median of REPEATS runs on fresh prompts (the samples are in the result).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from statistics import median

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.shapes import dummy_engine, random_tokens  # noqa: E402
from deltaserve.engine.llm_engine import LLMEngine  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402

_ids = iter(range(10**9))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def prefill(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 1) -> tuple[float, list]:
    """Sends the prompts together; returns (seconds until every one has its first token, outputs)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, detokenize=False)
    ids = [f"p{next(_ids)}" for _ in prompts]
    sync()
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    first, done = {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            first.setdefault(out.request_id, time.perf_counter())
            if out.finished:
                done[out.request_id] = out
    return max(first.values()) - start, [done[i] for i in ids]


REPEATS = 5  # each figure is the median of this many runs, each on fresh prompts


def follow_up_turn(engine: LLMEngine, tokens, history_len: int) -> dict:
    """A first turn on a fresh history (its reply generated), then the follow-up turn, warm."""
    history = tokens(history_len)
    turn1_s, (turn1,) = prefill(engine, [history], 64)
    follow_up = history + turn1.outputs[0].token_ids + tokens(64)
    warm_s, (warm,) = prefill(engine, [follow_up])
    return {"history": history, "turn1_s": turn1_s, "turn1_recomputed": len(history) - turn1.num_cached_tokens,
            "follow_up": follow_up, "warm_s": warm_s, "warm": warm}


def _warm_up(engine: LLMEngine, tokens, history_len: int) -> None:
    """Runs every path the measurements take once, at the same lengths (cold prefill, decode with
    captures, a restored follow-up, a shared prefix), so no measurement includes a kernel's first
    compilation."""
    history = tokens(history_len)
    _, (reply,) = prefill(engine, [history], 64)
    follow_up = history + reply.outputs[0].token_ids + tokens(64)
    prefill(engine, [follow_up])  # warm
    engine.reset_prefix_cache()
    prefill(engine, [follow_up])  # cold: its passes have other lengths than the warm ones
    shared = tokens(2048)
    prefill(engine, [shared + tokens(64) for _ in range(8)])
    prefill(engine, [shared + tokens(64) for _ in range(8)])
    engine.reset_prefix_cache()


def _warm_ttft_eager(engine: LLMEngine, history, follow_up) -> float | None:
    """The warm follow-up again with its prefill pass run eagerly instead of replayed as a graph (the
    second of two tries, so no kernel compiles in it); None when the engine has no prefill graphs."""
    runner = engine.loaded.runner
    graphs, runner.prefill_graphs = runner.prefill_graphs, None
    if graphs is None:
        return None
    times = []
    for _ in range(2):
        engine.reset_prefix_cache()
        prefill(engine, [history], 64)
        times.append(prefill(engine, [follow_up])[0])
    runner.prefill_graphs = graphs
    return round(times[-1], 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", default="qwen3.5-35b-a3b")
    ap.add_argument("--history", type=int, default=8192)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    engine = dummy_engine(args.shape, max_num_seqs=16, max_model_len=16384, max_num_batched_tokens=8192)
    tokens = random_tokens(engine.model_config.vocab_size)
    result = {**results_io.header(), "shape": args.shape, "block_size": engine.config.block_size}

    _warm_up(engine, tokens, args.history)
    turns = [follow_up_turn(engine, tokens, args.history) for _ in range(REPEATS)]  # each: history, turn 1, warm
    colds = []
    for turn in turns:
        engine.reset_prefix_cache()
        colds.append(prefill(engine, [turn["follow_up"]]))
    first, warm_s, cold_s = turns[0], median([t["warm_s"] for t in turns]), median([s for s, _ in colds])
    warm, cold, follow_up = first["warm"], colds[0][1][0], first["follow_up"]
    result["follow_up_turn"] = {
        "history_tokens": args.history, "turn2_prompt_tokens": len(follow_up),
        "turn1_ttft_s": round(first["turn1_s"], 4), "turn1_recomputed_tokens": first["turn1_recomputed"],
        "cold_ttft_s": round(cold_s, 4), "warm_ttft_s": round(warm_s, 4),
        "speedup": round(cold_s / warm_s, 1),
        "repeats": REPEATS, "cold_ttft_samples_s": [round(s, 4) for s, _ in colds],
        "warm_ttft_samples_s": [round(t["warm_s"], 4) for t in turns],
        "warm_cached_tokens": warm.num_cached_tokens, "warm_recomputed_tokens": len(follow_up) - warm.num_cached_tokens,
        "cold_recomputed_tokens": len(follow_up) - cold.num_cached_tokens,
        "same_first_token": warm.outputs[0].token_ids == cold.outputs[0].token_ids,
        "warm_ttft_eager_prefill_s": _warm_ttft_eager(engine, first["history"], follow_up),
    }
    print(result["follow_up_turn"], flush=True)
    results_io.write(args.out, result)

    colds, warms = [], []
    for _ in range(REPEATS):
        shared = tokens(2048)
        engine.reset_prefix_cache()
        colds.append(prefill(engine, [shared + tokens(64) for _ in range(8)]))
        engine.reset_prefix_cache()
        prefill(engine, [shared + tokens(64)])  # an earlier request leaves the shared prefix cached
        endings = [tokens(64) for _ in range(8)]
        warms.append(prefill(engine, [shared + e for e in endings]))
    engine.reset_prefix_cache()
    cold_outs = prefill(engine, [shared + e for e in endings])[1]  # the last warm prompts cold, for their tokens
    cold_s, warm_s = median([s for s, _ in colds]), median([s for s, _ in warms])
    warm_outs = warms[-1][1]
    result["shared_prefix"] = {
        "requests": 8, "prefix_tokens": 2048, "ending_tokens": 64,
        "cold_total_prefill_s": round(cold_s, 4), "warm_total_prefill_s": round(warm_s, 4),
        "speedup": round(cold_s / warm_s, 1), "repeats": REPEATS,
        "cold_samples_s": [round(s, 4) for s, _ in colds], "warm_samples_s": [round(s, 4) for s, _ in warms],
        "warm_cached_tokens": [o.num_cached_tokens for o in warm_outs],
        "same_first_tokens": [o.outputs[0].token_ids for o in warm_outs] == [o.outputs[0].token_ids for o in cold_outs],
    }
    print(result["shared_prefix"], flush=True)
    results_io.write(args.out, result)


if __name__ == "__main__":
    main()
