"""The step a request arrives in while others decode: two graphs (the decode rows', then the new prompt's
prefill graph) against one eager pass, random weights in a real shape.

    python benchmarks/arrival_step.py SHAPE --concurrency 1,8,32,128 --prompt-len 128,512,1024 --rounds 3 \
        --out benchmarks/results/arrival_step_SHAPE.json

C requests of 128-token prompts decode; a few steps on, one prompt of L tokens arrives, and the engine.step()
call whose step takes it beside the decode rows is timed to its return (its tokens read back, the GPU idle
before it). Both ways run in one process, alternated (A B B A) over `--rounds`: the split as the engine
makes it (ModelRunner.graph_passes, here for a prompt of any length: MIXED_SPLIT_MAX_ROWS and
MIXED_SPLIT_MAX_ROWS_BESIDE_MANY are what these times set), and the same step kept eager (both 0), each after
one untimed trial of its own. `split_steps` counts the split arm's steps that did run split. `decode_step_ms`
is a plain decode step of the C rows, for scale. Prefix caching is off, so the prompt arrives as one chunk.

`--drafts k`: the engine drafts by prompt lookup, and every decoding sequence verifies k drafts each step (random
tokens stand for what lookups find: a random model's tokens seldom repeat), so the split is their verify graph
then the prompt's prefill graph (SpeculativeStep._execute_split), and `decode_step_ms` a verify step. With
`--method mtp` the shape's config is given one MTP layer and its head drafts the k tokens (random weights: all
refuted), its passes over the prompt's rows and the verify rows part of the step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.engine_bench import sync  # noqa: E402
from benchmarks.shapes import dummy_engine, random_tokens  # noqa: E402
from deltaserve.engine.llm_engine import LLMEngine  # noqa: E402
from deltaserve.errors import RequestNotFoundError  # noqa: E402
from deltaserve.runner import model_runner  # noqa: E402
from deltaserve.runner.mtp_drafter import useful_drafts  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402

DECODING = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True, detokenize=False)
ARRIVING = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, detokenize=False)
PROMPT = 128
SPLIT_ROWS = model_runner.MIXED_SPLIT_MAX_ROWS
SPLIT_ROWS_BESIDE_MANY = model_runner.MIXED_SPLIT_MAX_ROWS_BESIDE_MANY
DECODE_STEPS = 8  # decode steps before the arrival (the first ones timed for decode_step_ms)


def trial(engine: LLMEngine, tokens, concurrency: int, prompt_len: int, split: bool) -> tuple[float, float, int]:
    """One arrival: the arrival step's wall time and a decode step's mean wall time before it, in seconds, and
    how many steps ran split."""
    runner = engine.runner
    model_runner.MIXED_SPLIT_MAX_ROWS = max(SPLIT_ROWS, prompt_len) if split else 0
    model_runner.MIXED_SPLIT_MAX_ROWS_BESIDE_MANY = max(SPLIT_ROWS_BESIDE_MANY, prompt_len) if split else 0
    splits = []
    if runner.speculative is not None:
        speculative = runner.speculative
        execute_split = type(speculative)._execute_split

        def counted_split(runner_, plan, decoding, *parts):
            if decoding is not None:
                splits.append(plan)
            return execute_split(speculative, runner_, plan, decoding, *parts)

        speculative._execute_split = counted_split
    else:
        execute_graphs = type(runner)._execute_graphs

        def counted(plan, decode, *parts):
            if decode is not None:
                splits.append(plan)
            return execute_graphs(runner, plan, decode, *parts)

        runner._execute_graphs = counted
    ids = [f"d{time.monotonic_ns()}-{i}" for i in range(concurrency)]
    for request_id in ids:
        engine.add_request(request_id, tokens(PROMPT), DECODING)
    prefilled: set[str] = set()
    while len(prefilled) < concurrency:  # their prefill, in as many steps as the budget takes
        prefilled.update(out.request_id for out in engine.step() if out.outputs[0].token_ids)
    sync()
    started = time.perf_counter()
    for _ in range(DECODE_STEPS):
        engine.step()
    sync()
    decode_step = (time.perf_counter() - started) / DECODE_STEPS
    arriving = f"a{time.monotonic_ns()}"
    engine.add_request(arriving, tokens(prompt_len), ARRIVING)
    started = time.perf_counter()
    while not any(out.request_id == arriving and out.outputs[0].token_ids for out in engine.step()):
        pass
    arrival = time.perf_counter() - started
    for request_id in ids + [arriving]:
        try:
            engine.abort(request_id)
        except RequestNotFoundError:  # the arriving request finished meanwhile
            pass
    while engine.has_unfinished_requests():
        engine.step()
    sync()
    return arrival, decode_step, len(splits)


def draft_always(engine: LLMEngine, tokens) -> None:
    """Every decoding sequence's drafts: as many random tokens as its next step may verify."""
    drafter = engine.runner.speculative.drafter
    k = drafter.num_speculative_tokens

    def propose(hidden, rows, verify_rung=None):
        return {row.chunk.request: tokens(n) for row in rows if (n := useful_drafts(row, k))}

    drafter.propose = propose


def pool_sizes(engine: LLMEngine) -> dict:
    """What the engine's caches took at start-up: its KV blocks, and with drafts on a GDN model the GiB its verify
    rows hold (their slots' states, and the stash of their GDN inputs where the tree keeps one)."""
    sizes = {"kv_blocks": engine.loaded.blocks.num_blocks}
    speculative = engine.runner.speculative
    if speculative is not None and speculative.verify_states is not None:
        pool = speculative.verify_states._tensors
        stash = getattr(speculative, "stash", None) or getattr(speculative.graphs, "stash", None)
        tensors = [pool.conv_all, pool.h_all] + ([stash.kv, stash.ba] if stash is not None else [])
        sizes["verify_pool_gib"] = round(sum(t.numel() * t.element_size() for t in tensors) / 2**30, 3)
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--prompt-len", default="128,512,1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--drafts", type=int, default=0, help="k: every decoding sequence verifies k drafts")
    ap.add_argument("--method", default="ngram", help="with --drafts: ngram (prompt lookup), or mtp (the head's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ladder = [int(c) for c in args.concurrency.split(",")]
    lengths = [int(n) for n in args.prompt_len.split(",")]
    budget = max(2048, max(lengths) + max(ladder))  # the arriving prompt in one chunk beside the decode rows
    drafting = {}
    if args.drafts:
        drafting["speculative_config"] = {"method": args.method, "num_speculative_tokens": args.drafts}
    engine = dummy_engine(args.shape, device=args.device, max_num_seqs=max(ladder) + 1, max_num_batched_tokens=budget,
                          max_model_len=args.max_model_len, enable_prefix_caching=False,
                          with_head=bool(args.drafts) and args.method == "mtp", **drafting)
    tokens = random_tokens(engine.model_config.vocab_size)
    if args.drafts and args.method == "ngram":
        draft_always(engine, tokens)
    result = {**results_io.header(), "shape": args.shape, "max_num_batched_tokens": budget, "drafts": args.drafts,
              "method": args.method if args.drafts else None, **pool_sizes(engine), "rows": []}
    for c in ladder:
        for length in lengths:
            times, splits = {True: [], False: []}, {True: 0, False: 0}
            decode = []
            for split in (True, False):  # one untimed trial each: kernels compiled, plans built
                trial(engine, tokens, c, length, split)
            for round_ in range(args.rounds):
                for split in (True, False) if round_ % 2 == 0 else (False, True):
                    arrival, step, split_steps = trial(engine, tokens, c, length, split)
                    times[split].append(round(arrival * 1e3, 3))
                    splits[split] += split_steps
                    decode.append(step * 1e3)
            row = {"concurrency": c, "prompt_len": length, "split_ms": times[True], "eager_ms": times[False],
                   "decode_step_ms": round(statistics.median(decode), 3), "split_steps": splits[True],
                   "split_steps_of_the_eager_arm": splits[False]}
            result["rows"].append(row)
            print(row, flush=True)
            results_io.write(args.out, result)
    print(f"\n{'C':>4} {'prompt':>7} {'split ms':>10} {'eager ms':>10} {'decode ms':>10}")
    for row in result["rows"]:
        print(f"{row['concurrency']:>4} {row['prompt_len']:>7} {statistics.median(row['split_ms']):>10.2f} "
              f"{statistics.median(row['eager_ms']):>10.2f} {row['decode_step_ms']:>10.2f}")


if __name__ == "__main__":
    main()
