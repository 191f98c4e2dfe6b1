"""Where a speculative decoding step's time goes, on one GPU, random weights in a real shape (Qwen3.5-9B by default,
its config given one MTP layer).

Closed batches of C prompts of 128 tokens, 128 tokens generated greedily (ignore_eos), after a warm-up batch.
Each part of a step is timed between device synchronisations (which cost a little themselves): the verify pass
(a graph replay, or the eager pass; its loading of the step buffers apart), the verdicts (draft_verifier), the
set-back of refuted sequences' conv states and the commit of every verify chunk's recurrent state through its
kept rows, the MTP head's drafting, and the rest of the engine step (scheduling, the host batch, outputs). Plain
decoding at the same concurrency is timed the same way (its whole step) beside it.
--profile C adds the CUDA kernels of a batch at concurrency C of each engine, by total time
(profile_steps.kernel_table). --method ngram drafts by prompt lookup instead (no head: random prompts and a random
model's tokens seldom repeat, so most lookups miss and most steps verify no drafts).

    python benchmarks/speculative_step_times.py qwen3.5-9b --out benchmarks/results/speculative_step_times_SHAPE.json
        [--concurrency 1,16] [--drafts 2] [--method mtp|ngram] [--profile C]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.profile_steps import kernel_table  # noqa: E402
from benchmarks.speculative_bench import PROMPT_LEN, TOKENS, closed_batch_inputs  # noqa: E402
from deltaserve import LLM  # noqa: E402



class PartTimes:
    """Wraps methods with synchronised wall clocks: {part: [ms, ...]}."""

    def __init__(self):
        self.ms: dict[str, list[float]] = defaultdict(list)

    def wrap(self, owner, name: str, part: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            torch.cuda.synchronize()
            self.ms[part].append((time.perf_counter() - start) * 1e3)
            return out

        setattr(owner, name, timed)

    def medians(self, steps: int) -> dict:
        """Each part's median ms and how many of the steps ran it."""
        return {part: {"median_ms": round(statistics.median(v), 3), "calls": len(v)} for part, v in self.ms.items()
                if v and len(v) >= steps // 4}


def instrument(llm: LLM) -> PartTimes:
    times = PartTimes()
    runner = llm.engine.runner
    speculative = runner.speculative
    if speculative is not None:
        if speculative.graphs is not None:
            times.wrap(speculative.graphs, "run", "verify_graph")
            times.wrap(speculative.graphs.buffers, "load_verify", "verify_graph.load_verify")
            times.wrap(speculative.graphs.buffers, "load_drafting", "drafting.load_drafting")
        times.wrap(speculative, "_eager_pass", "verify_eager")
        times.wrap(speculative, "_sample", "verdicts")
        if speculative.verify_states is not None:
            times.wrap(speculative.verify_states, "restore_conv", "set_back.conv")
        if speculative.stash is not None:
            times.wrap(speculative.stash, "commit", "set_back.commit")
        times.wrap(speculative.drafter, "propose", "drafting")
    times.wrap(llm.engine, "step", "engine_step")
    return times


def timed_batches(llm: LLM, concurrency: list[int], prompts: dict, params) -> list[dict]:
    rows = []
    for c in concurrency:
        llm.generate(prompts[c], params, use_tqdm=False)  # warm-up
        times = instrument(llm)
        before = _draft_counts(llm)
        start = time.perf_counter()
        llm.generate(prompts[c], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        steps = len(times.ms["engine_step"])
        drafted, kept = (b - a for a, b in zip(before, _draft_counts(llm)))
        rows.append({"concurrency": c, "seconds": round(seconds, 4), "steps": steps,
                     "tok_s": round(c * TOKENS / seconds, 1), "drafts_verified": drafted, "drafts_kept": kept,
                     "parts": times.medians(steps)})
        _unwrap(llm)
        print(rows[-1], flush=True)
    return rows


def _draft_counts(llm: LLM) -> tuple[int, int]:
    stats = llm.engine.stats()  # live: read at once
    return stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens


def _unwrap(llm: LLM) -> None:
    """Drops the wrappers (instance attributes shadowing the class's methods)."""
    runner = llm.engine.runner
    owners = [llm.engine]
    if runner.speculative is not None:
        s = runner.speculative
        owners += [s, s.drafter] + [o for o in (s.graphs, s.verify_states, s.stash) if o is not None]
        owners += [s.graphs.buffers] if s.graphs is not None else []
    for owner in owners:
        for name in ("run", "_eager_pass", "_sample", "restore_conv", "commit", "propose", "step", "load_verify",
                     "load_drafting"):
            owner.__dict__.pop(name, None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", default="qwen3.5-9b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--drafts", type=int, default=2)
    ap.add_argument("--method", default="mtp", help="mtp, or ngram (prompt lookup, 1 to 5 tokens matched)")
    ap.add_argument("--profile", type=int, default=0, help="a concurrency whose batch's kernels are listed")
    args = ap.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    path, prompts, params, engine = closed_batch_inputs(args.shape, concurrency)
    result = {**results_io.header(), "shape": args.shape, "prompt_len": PROMPT_LEN, "tokens": TOKENS,
              "method": args.method, "num_speculative_tokens": args.drafts}
    llm = LLM(path, **engine)
    result["plain"] = timed_batches(llm, concurrency, prompts, params)
    if args.profile:
        result["plain_kernels"] = kernel_table(lambda: llm.generate(prompts[args.profile], params, use_tqdm=False), 30)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    config = {"method": args.method, "num_speculative_tokens": args.drafts}
    if args.method == "ngram":
        config.update(prompt_lookup_min=1, prompt_lookup_max=5)
    llm = LLM(path, speculative_config=config, **engine)
    result["speculative"] = timed_batches(llm, concurrency, prompts, params)
    if args.profile:
        result["speculative_kernels"] = kernel_table(
            lambda: llm.generate(prompts[args.profile], params, use_tqdm=False), 30)
    results_io.write(args.out, result)


if __name__ == "__main__":
    main()
