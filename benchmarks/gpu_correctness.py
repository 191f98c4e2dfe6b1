"""GPU correctness of the whole engine on tiny random checkpoints written by transformers:

- greedy tokens on the GPU in fp32 identical to the CPU reference path, every architecture;
- in bf16, decode steps replayed as CUDA graphs give the same tokens as the same steps run eagerly,
  greedy and with seeded sampled rows beside greedy ones (top-k among them, and top-p / min-p alone);
- each prompt sent alone (its prefill passes replayed as graphs), and prompts of 128, 700, 1500 and 2048 tokens
  (128 and 2048 fill their rungs beside a padding sequence of no rows) and 3000 (a chunk of 2048 rows that samples
  nothing, so no LM head runs after its graph, then 952 over its keys), gives in fp32 the CPU's tokens;
- two first prompts of 1100 and 900 tokens in one step (an eager pass, paged attention in 128-row tiles
  walking their unmasked interior) give in fp32 the CPU's tokens;
- in bf16 with graphs, a prompt and a follow-up turn sent twice (the second a prefix-cache hit) give
  byte-identical tokens and logprobs;
- in bf16 with graphs, no launched decode step (greedy rows beside seeded sampled ones) waits for the GPU;
- greedy tokens under repetition, frequency and presence penalties on the GPU in fp32 identical to the CPU's;
- a prompt arriving while two others decode (their step split into a decode graph and a prefill graph) gives,
  with the rows decoding beside it, in fp32 the CPU's tokens, and so does one of 800 tokens arriving while 32
  others decode (a chunk past 512 rows, split beside that many decode rows);
- rows held to a grammar (a regex, greedy; a JSON schema, seeded sampling) beside free greedy rows give in fp32
  the CPU's tokens, and in bf16 the same tokens with graphs as eagerly (their steps run through the sampler's
  mask, never launched ahead);
- in bf16, rows that finish at different steps (the batch passing through sizes between the graphs' rungs) give
  the same tokens with graphs as eagerly;
- rows whose logits the sampler changes (a logit bias, min_tokens with stop tokens, allowed tokens, bad words)
  give in fp32 the CPU's tokens, and in bf16 the same tokens with graphs as eagerly;
- a request whose constraints refuse every token, arriving beside decoding rows in a decode step launched ahead,
  ends with NoTokenAllowedError; the other rows' tokens are unchanged and the engine serves on.
- rows asking logprobs of named tokens (logprob_token_ids) beside one asking top ones, and rows ending at a repetition
  (repetition_detection, one row's loop made certain by a logit bias), give in fp32 the CPU's tokens, finish
  reasons and logprob entries (ids and ranks equal, logprobs within 1e-4);
- rows with a thinking_token_budget (their prompts opening a think block; greedy and seeded sampled, beside a free
  greedy row) give in fp32 the CPU's tokens, with `</think>` where their budgets fall due, and in bf16 the same
  tokens with graphs as eagerly;
- beam searches of width 3 over the prompts (each step's requests restored from their parents' prefix-cache tails)
  give in fp32 the CPU's beams, their summed logprobs within fp32 rounding;
- on the hybrid architectures, given an MTP head, greedy speculative decoding (2 drafts a step) gives in fp32 the
  CPU's plain greedy tokens (penalised rows too), and seeded sampled rows beside greedy ones, and rows under
  grammars, biases and refusals, the CPU's speculative tokens; in bf16 the share of its greedy tokens that match
  plain greedy decoding's is reported (the verify pass rounds otherwise); prompts arriving one at a time beside
  its decoding sequences (prefill graphs alone and after a verify graph) give in fp32 the CPU's greedy tokens;
- on every architecture, prompt lookup (3 drafts copied from earlier tokens) gives in fp32 the CPU's plain greedy
  tokens over prompts that repeat a stretch, and seeded sampled rows the CPU's prompt-lookup tokens (its steps
  replay verify graphs, a sequence without a match padded in them, and decode graphs where no sequence has one);
  prompts arriving one at a time beside its decoding sequences (prefill graphs alone, after a decode graph and
  after a verify graph, a prefix-cache hit restored in one) give in fp32 the CPU's plain greedy tokens; the
  speculative rows count their passes by the graphs they replay.

    python benchmarks/gpu_correctness.py --out benchmarks/results/gpu_correctness.json
    [--archs qwen3.5,qwen3.5-moe] [--gdn-state-dtype bfloat16]   (every engine of the run uses that state dtype)
    [--speculative-only]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from deltaserve import LLM, BeamSearchParams, NoTokenAllowedError, SamplingParams, StructuredOutputsParams  # noqa: E402
from deltaserve.runner.model_runner import MANY_DECODE_ROWS  # noqa: E402
from tests.arrivals import arrival_requests, arrivals as arrivals_one_at_a_time  # noqa: E402
from tests.checkpoints import ARCHITECTURES, add_mtp_weights, add_think_tokens, make_checkpoint  # noqa: E402
from tests.read_off_drafts import read_off_drafts  # noqa: E402

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
WITH_LOGPROBS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2)
# Greedy rows beside seeded sampled ones: the steps' tokens come from the sampler, not the graph's argmax,
# and the next graph reads them where the sampler's tokens were copied.
MIXED = [GREEDY, SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True),
         GREEDY, SamplingParams(max_tokens=24, temperature=1.0, top_k=40, seed=12, ignore_eos=True)]
# Penalties: greedy rows' tokens from the GPU's penalised logits beside the CPU's.
PENALISED = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, repetition_penalty=1.3,
                           frequency_penalty=0.4, presence_penalty=0.3)
# Top-p and min-p without top-k: the sampled rows' masks are the nucleus kernels' floors.
NUCLEUS = [GREEDY, SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=13, ignore_eos=True),
           GREEDY, SamplingParams(max_tokens=24, temperature=1.0, min_p=0.05, seed=14, ignore_eos=True)]
# Structured outputs: a greedy row under a regex and a seeded sampled row under a JSON schema, beside free rows.
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer"}}, "required": ["name", "n"]}
STRUCTURED = [SamplingParams(max_tokens=24, temperature=0,
                             structured_outputs=StructuredOutputsParams(regex="[a-z]{2,5}( [0-9]{1,3}){1,4}")),
              GREEDY,
              SamplingParams(max_tokens=24, temperature=0.9, seed=15,
                             structured_outputs=StructuredOutputsParams(json=PERSON)),
              GREEDY]
# Rows whose logits the sampler changes before sampling, beside a plain greedy one: a logit bias, min_tokens with
# stop tokens, allowed tokens, bad words (sampled outside the decode graph; bad words never launched ahead).
ADJUSTED = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logit_bias={7: 3.0, 11: -5.0}),
            SamplingParams(max_tokens=24, temperature=0, min_tokens=12, stop_token_ids=[5, 9, 13, 17]),
            SamplingParams(max_tokens=24, temperature=0.9, seed=16, ignore_eos=True,
                           allowed_token_ids=list(range(40, 90))),
            SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, bad_words=["the", "a", "of"])]
# Rows with a thinking budget, their prompts ending in <think>, beside a free greedy row (sampled outside the graph).
THINKING = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, thinking_token_budget=3),
            GREEDY,
            SamplingParams(max_tokens=24, temperature=0.9, seed=17, ignore_eos=True, thinking_token_budget=6),
            SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, thinking_token_budget=0)]
# Named logprobs and repetition detection: host-side rows the sampler and the engine read after each step.
NAMED_AND_LOOPING = [SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=4,
                                    logprob_token_ids=[3, 50, 120, 299]),
                     SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logit_bias={42: 100.0},
                                    repetition_detection={"max_pattern_size": 2, "min_count": 3}),
                     SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2,
                                    repetition_detection={"max_pattern_size": 4, "min_count": 2}),
                     SamplingParams(max_tokens=16, temperature=0.8, seed=18, ignore_eos=True,
                                    logprob_token_ids=[7, 8])]
# Rows that finish at different steps: the batch shrinks through sizes between the graphs' rungs (3 rows replay
# rung 4 beside a padding row; eagerly they run as 3).
SHRINKING = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (8, 24, 13, 24)]
BEAMS = BeamSearchParams(beam_width=3, max_tokens=12, ignore_eos=True)


def tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def alone(llm: LLM, prompts) -> list[list[int]]:
    return [tokens(llm, [p])[0] for p in prompts]


def replays_exactly(llm: LLM, prompt: list[int], rng: random.Random) -> bool:
    """A prompt, then a follow-up turn on it, each sent twice: the second sends are cache hits."""
    llm.reset_prefix_cache()
    same = []
    for _ in range(2):
        first, again = (llm.generate([prompt], WITH_LOGPROBS, use_tqdm=False)[0].outputs[0] for _ in range(2))
        same.append(first.token_ids == again.token_ids and first.logprobs == again.logprobs)
        prompt = prompt + first.token_ids + [rng.randrange(300) for _ in range(20)]
    return all(same)


def arrivals(llm: LLM, decoding, arriving) -> tuple[list[list[int]], int]:
    """The `decoding` prompts decode; a few steps on, `arriving` arrives alone (a step of decode rows and one
    chunk: two graphs on the GPU, see model_runner.mixed_split_max_rows). Their greedy tokens, the arriving
    prompt's last, and the steps that ran split."""
    engine, done = llm.engine, {}
    runner = engine.runner
    execute_graphs, splits = runner._execute_graphs, []

    def counted(plan, decode, *parts):
        if decode is not None:
            splits.append(plan)
        return execute_graphs(plan, decode, *parts)

    runner._execute_graphs = counted
    ids = [f"arrival-{i}" for i in range(len(decoding) + 1)]
    try:
        for request_id, prompt in zip(ids, decoding):
            engine.add_request(request_id, prompt, GREEDY)
        for step in range(40):
            if step == 4:
                engine.add_request(ids[-1], arriving, GREEDY)
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
    finally:
        del runner._execute_graphs  # the class's method again
    return [done[i] for i in ids], len(splits)


def ends_where_due(outputs: list[list[int]], tags: tuple[int, int]) -> bool:
    """Whether each budgeted row of THINKING wrote </think> once its block held its budget (or closed it earlier,
    or opened another)."""
    start, end = tags
    for params, out in zip(THINKING, outputs):
        budget = params.thinking_token_budget
        if budget is not None and end not in out[: budget + 1] and start not in out[:budget]:
            return False
    return True


def named_and_looping(gpu_llm: LLM, cpu_llm: LLM, prompts) -> dict:
    """GPU against CPU on NAMED_AND_LOOPING: tokens, finish reasons, and each logprob entry's ids and ranks
    equal, its logprobs within 1e-4."""
    gpu, cpu = (llm.generate(prompts, NAMED_AND_LOOPING, use_tqdm=False) for llm in (gpu_llm, cpu_llm))
    pairs = [(g.outputs[0], c.outputs[0]) for g, c in zip(gpu, cpu)]
    same_tokens = all(g.token_ids == c.token_ids and g.finish_reason == c.finish_reason for g, c in pairs)
    entries_agree = all(
        (g.logprobs is None) == (c.logprobs is None) and all(
            ge.keys() == ce.keys() and all(ge[t].rank == ce[t].rank and abs(ge[t].logprob - ce[t].logprob) < 1e-4
                                           for t in ge)
            for ge, ce in zip(g.logprobs or [], c.logprobs or []))
        for g, c in pairs)
    return {"identical": same_tokens, "logprob_entries_agree": entries_agree,
            "finish_reasons": [g.finish_reason for g, _ in pairs]}


def dead_end_beside(llm: LLM, prompts) -> dict:
    """Two prompts decode; a few steps on, a sampled request arrives whose allowed tokens min_tokens holds back as
    stop tokens, its prompt cached (its first token then comes from a decode step, launched ahead, whose row
    refuses every token and still feeds the next step its token). It ends with NoTokenAllowedError at output
    token 0, the decoding rows give their tokens as without it, and the engine serves on."""
    stuck = SamplingParams(max_tokens=24, temperature=0.9, seed=17, min_tokens=4, stop_token_ids=[5, 9],
                           allowed_token_ids=[5, 9])
    decoding, arriving = prompts[1:3], prompts[3]
    expected = tokens(llm, decoding)
    tokens(llm, [arriving])  # caches the arriving prompt
    engine, finished = llm.engine, {}
    for i, prompt in enumerate(decoding):
        engine.add_request(f"free-{i}", prompt, GREEDY)
    for step in range(200):
        if step == 4:
            engine.add_request("stuck", arriving, stuck)
        finished.update((o.request_id, o) for o in engine.step(final_only=True))
        if not engine.has_unfinished_requests():
            break
    error = finished["stuck"].error
    return {"error": None if error is None else str(error),
            "ended_at_output_token_0": isinstance(error, NoTokenAllowedError) and "output token 0" in str(error)
            and all(o.token_ids == [] for o in finished["stuck"].outputs),
            "others_identical": [finished[f"free-{i}"].outputs[0].token_ids for i in range(2)] == expected,
            "serves_after": tokens(llm, decoding) == expected}


def launches_without_sync(llm: LLM, prompts) -> dict:
    """The MIXED and NUCLEUS prompts with every launched decode step under torch's sync debug mode set to raise: a
    launched step (greedy rows replayed, sampled rows sampled on the device) must not wait for the GPU, or
    asynchronous scheduling loses the overlap of planning and running. The first error, if any, is kept."""
    import torch

    runner = llm.engine.runner
    launch, found = runner.launch, {"launches": 0, "error": None}

    def checked(plan, previous):
        found["launches"] += 1
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(plan, previous)
        except RuntimeError as error:
            found["error"] = found["error"] or str(error)[:300]
            raise
        finally:
            torch.cuda.set_sync_debug_mode("default")

    runner.launch = checked
    try:
        tokens(llm, prompts, MIXED)
        tokens(llm, prompts, NUCLEUS)
    finally:
        del runner.launch  # the class's method again
    return {**found, "none_synced": found["launches"] > 0 and found["error"] is None}


def beams_alike(gpu_llm: LLM, cpu_llm: LLM, prompts) -> dict:
    """Beam searches (each step restored from the prefix cache's tails) on both engines: the same beams, their
    summed logprobs within fp32 rounding."""
    gpu, cpu = (llm.beam_search([{"prompt_token_ids": p} for p in prompts], BEAMS) for llm in (gpu_llm, cpu_llm))
    pairs = [(a, b) for x, y in zip(gpu, cpu) for a, b in zip(x.sequences, y.sequences)]
    return {"identical": all(a.tokens == b.tokens for a, b in pairs),
            "cum_logprob_max_diff": max(abs(a.cum_logprob - b.cum_logprob) for a, b in pairs)}


MTP_ARCHITECTURES = ("qwen3-next", "qwen3.5", "qwen3.5-moe", "qwen3.5-vl")
SPECULATIVE = {"method": "mtp", "num_speculative_tokens": 2}


def speculative_alike(path: str, cpu_llm: LLM, prompts, state: dict) -> dict:
    """Greedy and mixed (seeded sampled beside greedy) speculative decoding on the GPU against the CPU: fp32 greedy
    against the CPU's plain greedy tokens, with the head's own drafts and with drafts read off those tokens (kept,
    so that the verify graphs set states back and the drafting graphs read kept rows); fp32 mixed against the
    CPU's speculative tokens; penalised greedy rows against the CPU's plain ones, and rows under grammars, biases and
    refusals (seeded sampled ones among them) against the CPU's speculative ones, all drafting; bf16 greedy's share
    of plain bf16 greedy's tokens, for information; how the fp32 engine's steps ran (step_paths)."""
    expected = tokens(cpu_llm, prompts)
    gpu = LLM(path, device="cuda", dtype="float32", max_num_seqs=8, speculative_config=SPECULATIVE, **state)
    paths = step_paths(gpu)
    cpu_drafting = LLM(path, device="cpu", speculative_config=SPECULATIVE, **state)
    greedy = tokens(gpu, prompts)
    mixed = tokens(gpu, prompts, MIXED) == tokens(cpu_drafting, prompts, MIXED)
    penalised = tokens(gpu, prompts, PENALISED) == tokens(cpu_llm, prompts, PENALISED)
    constrained = all(tokens(gpu, prompts, params) == tokens(cpu_drafting, prompts, params)
                      for params in (STRUCTURED, ADJUSTED))
    before = gpu.engine.stats()
    drafted, kept = before.spec_decode_num_draft_tokens, before.spec_decode_num_accepted_tokens
    read_off_drafts(gpu, prompts, expected, right_chance=1.0)
    read_off_greedy = tokens(gpu, prompts)
    after = gpu.engine.stats()
    del gpu
    bf16 = LLM(path, device="cuda", dtype="bfloat16", max_num_seqs=8, speculative_config=SPECULATIVE, **state)
    plain = LLM(path, device="cuda", dtype="bfloat16", max_num_seqs=8, enforce_eager=True, **state)
    bf16_drafted, reference = tokens(bf16, prompts), tokens(plain, prompts)
    return {"greedy_identical": greedy == expected, "read_off_greedy_identical": read_off_greedy == expected,
            "read_off_drafts_verified": after.spec_decode_num_draft_tokens - drafted,
            "read_off_drafts_kept": after.spec_decode_num_accepted_tokens - kept, "mixed_identical": mixed,
            "penalised_identical": penalised, "structured_and_adjusted_identical": constrained,
            "bf16_matching_share": sum(a == b for x, y in zip(bf16_drafted, reference) for a, b in zip(x, y))
            / sum(len(x) for x in reference), "fp32_steps": paths,
            "arrivals_identical": arrivals_alike(path, cpu_llm, state, SPECULATIVE)}


PROMPT_LOOKUP = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
LONGER_GREEDY = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)


def prompt_lookup_alike(path: str, cpu_llm: LLM, prompts, state: dict) -> dict:
    """Prompt lookup (drafts copied from earlier tokens: any architecture) on the GPU in fp32: greedy against the
    CPU's plain greedy tokens over prompts that repeat a stretch (drafts proposed from the first step, a random
    model refuting nearly all), then with the drafts it finds replaced by the plain tokens to come (kept, so that the
    verify graphs set states back and keep rows); mixed seeded rows against the CPU's prompt lookup; how the
    engine's steps ran (step_paths)."""
    repeating = [p + p + p[: len(p) // 2] for p in prompts]
    expected = tokens(cpu_llm, repeating, LONGER_GREEDY)
    gpu = LLM(path, device="cuda", dtype="float32", max_num_seqs=8, speculative_config=PROMPT_LOOKUP, **state)
    paths = step_paths(gpu)
    cpu_drafting = LLM(path, device="cpu", speculative_config=PROMPT_LOOKUP, **state)
    greedy = tokens(gpu, repeating, LONGER_GREEDY)
    first = draft_counts(gpu)
    mixed = tokens(gpu, repeating, MIXED) == tokens(cpu_drafting, repeating, MIXED)
    before = draft_counts(gpu)
    read_off_drafts(gpu, repeating, expected, right_chance=1.0)
    read_off_greedy = tokens(gpu, repeating, LONGER_GREEDY)
    after = draft_counts(gpu)
    return {"greedy_identical": greedy == expected, "drafts_verified": first[0], "drafts_kept": first[1],
            "read_off_greedy_identical": read_off_greedy == expected,
            "read_off_drafts_verified": after[0] - before[0], "read_off_drafts_kept": after[1] - before[1],
            "mixed_identical": mixed, "arrivals_identical": arrivals_alike(path, cpu_llm, state, PROMPT_LOOKUP),
            "steps": paths}


def arrivals_alike(path: str, cpu_llm: LLM, state: dict, config: dict) -> dict:
    """Prompts arriving one at a time beside sequences drafting by `config` (tests/arrivals.py: prefill graphs
    alone, after a verify graph and, for prompt lookup, after a decode graph; a prefix-cache hit restored in one),
    fp32 greedy on the GPU against the CPU's plain greedy tokens; how the steps ran."""
    prompts, greedy, expected, _ = arrival_requests(cpu_llm, random.Random(1), LONGER_GREEDY.max_tokens)
    gpu = LLM(path, device="cuda", dtype="float32", max_num_seqs=8, block_size=16, speculative_config=config,
              **state)
    paths = step_paths(gpu)
    return {"identical": arrivals_one_at_a_time(gpu, prompts, greedy) == expected, "steps": paths}


def step_paths(llm: LLM) -> dict:
    """Counts, as the engine runs, its speculative steps' passes by how they ran: verify graph replays, prompt
    lookup's decode and prefill graph replays, the speculative steps that ran a prompt chunk's prefill graph
    (after the verify graph where sequences decode beside it), and eager passes of the target (each builds its
    batch)."""
    runner = llm.engine.runner
    speculative = runner.speculative
    counts = {"verify_graph": 0, "decode_graph": 0, "prefill_graph": 0, "speculative_prefill_split": 0, "eager": 0}
    for owner, name, path in ((speculative.graphs, "run", "verify_graph"), (runner.graphs, "run", "decode_graph"),
                              (runner.prefill_graphs, "run", "prefill_graph"),
                              (speculative, "_execute_split", "speculative_prefill_split"),
                              (runner, "to_forward_batch", "eager")):
        if owner is not None:
            inner = getattr(owner, name)

            def counted(*args, _inner=inner, _path=path, **kwargs):
                counts[_path] += 1
                return _inner(*args, **kwargs)

            setattr(owner, name, counted)
    return counts


def draft_counts(llm: LLM) -> tuple[int, int]:
    """(drafts verified, drafts kept) so far; read at once, the stats object being live."""
    stats = llm.engine.stats()
    return stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default=",".join(ARCHITECTURES))
    ap.add_argument("--gdn-state-dtype", default="float32")
    ap.add_argument("--speculative-only", action="store_true", help="the MTP head's and prompt lookup's rows alone")
    args = ap.parse_args()
    state = {"gdn_state_dtype": args.gdn_state_dtype}
    rng = random.Random(0)
    prompts = [[rng.randrange(300) for _ in range(n)] for n in (1, 17, 90, 33)]
    # alone: rungs 128 and 2048 filled, 704 and 1536 (a first prompt past 1024 rows, paged attention in a graph), and
    # two chunks under the 2048-token step, the second attending over the first's keys
    long_prompts = [[rng.randrange(300) for _ in range(n)] for n in (128, 700, 1500, 2048, 3000)]
    long_pair = [[rng.randrange(300) for _ in range(n)] for n in (1100, 900)]
    many = [[rng.randrange(300) for _ in range(rng.randint(2, 40))] for _ in range(MANY_DECODE_ROWS)]
    many_arriving = [rng.randrange(300) for _ in range(800)]
    result = {**results_io.header(), "gdn_state_dtype": args.gdn_state_dtype, "fp32_gpu_vs_cpu": {},
              "graph_vs_eager_bf16": {}, "graph_vs_eager_bf16_mixed_sampling": {},
              "graph_vs_eager_bf16_top_p_min_p_sampling": {}, "fp32_alone_gpu_vs_cpu": {},
              "bf16_graph_cache_hit_byte_identical": {}, "bf16_graph_launches_without_sync": {},
              "fp32_penalised_gpu_vs_cpu": {}, "fp32_long_pair_gpu_vs_cpu": {}, "fp32_arrival_gpu_vs_cpu": {},
              "fp32_arrival_beside_many_gpu_vs_cpu": {}, "fp32_structured_gpu_vs_cpu": {},
              "graph_vs_eager_bf16_structured": {}, "graph_vs_eager_bf16_shrinking_batch": {},
              "fp32_adjusted_gpu_vs_cpu": {}, "graph_vs_eager_bf16_adjusted": {}, "fp32_dead_end_beside_decoding": {},
              "fp32_thinking_budget_gpu_vs_cpu": {}, "graph_vs_eager_bf16_thinking_budget": {},
              "fp32_named_logprobs_and_repetition_gpu_vs_cpu": {}, "fp32_beam_search_gpu_vs_cpu": {},
              "speculative_mtp_gpu_vs_cpu": {}, "prompt_lookup_gpu_vs_cpu": {}}
    for arch in args.archs.split(","):
        path = make_checkpoint(arch, tempfile.mkdtemp(), max_position_embeddings=4096)  # room for long_prompts
        if arch in MTP_ARCHITECTURES:
            add_mtp_weights(path, seed=0)
        tags = add_think_tokens(path)
        thinking_prompts = [p + [tags[0]] for p in prompts]
        cpu_llm = LLM(path, device="cpu", **state)
        if args.speculative_only:
            if arch in MTP_ARCHITECTURES:
                result["speculative_mtp_gpu_vs_cpu"][arch] = speculative_alike(path, cpu_llm, prompts, state)
            result["prompt_lookup_gpu_vs_cpu"][arch] = prompt_lookup_alike(path, cpu_llm, prompts, state)
            results_io.write(args.out, result)
            continue
        gpu_llm = LLM(path, device="cuda", dtype="float32", max_num_seqs=8, **state)
        cpu, gpu = tokens(cpu_llm, prompts), tokens(gpu_llm, prompts)
        eager_llm = LLM(path, device="cuda", dtype="bfloat16", enforce_eager=True, max_num_seqs=8, **state)
        eager, eager_mixed = tokens(eager_llm, prompts), tokens(eager_llm, prompts, MIXED)
        eager_nucleus = tokens(eager_llm, prompts, NUCLEUS)
        graph_llm = LLM(path, device="cuda", dtype="bfloat16", max_num_seqs=8, **state)
        graph, graph_mixed = tokens(graph_llm, prompts), tokens(graph_llm, prompts, MIXED)
        graph_nucleus = tokens(graph_llm, prompts, NUCLEUS)
        # both engines have served the same requests so far, so their prefix caches restore at the same points
        # (a hit restored elsewhere agrees with a miss only to rounding, which bf16 tokens of a random model show)
        structured_pair = [tokens(llm, prompts, STRUCTURED) for llm in (graph_llm, eager_llm)]
        shrinking_pair = [tokens(llm, prompts, SHRINKING) for llm in (graph_llm, eager_llm)]
        adjusted_pair = [tokens(llm, prompts, ADJUSTED) for llm in (graph_llm, eager_llm)]
        thinking_pair = [tokens(llm, thinking_prompts, THINKING) for llm in (graph_llm, eager_llm)]
        cpu_llm.reset_prefix_cache()
        gpu_llm.reset_prefix_cache()
        result["fp32_alone_gpu_vs_cpu"][arch] = {
            "identical": alone(gpu_llm, prompts + long_prompts) == alone(cpu_llm, prompts + long_prompts)}
        result["bf16_graph_cache_hit_byte_identical"][arch] = replays_exactly(graph_llm, prompts[2], rng)
        result["bf16_graph_launches_without_sync"][arch] = launches_without_sync(graph_llm, prompts)
        pair = tokens(gpu_llm, long_pair)
        result["fp32_long_pair_gpu_vs_cpu"][arch] = {"identical": pair == tokens(cpu_llm, long_pair)}
        arrived, splits = arrivals(gpu_llm, prompts[1:3], prompts[3])
        result["fp32_arrival_gpu_vs_cpu"][arch] = {
            "identical": arrived == arrivals(cpu_llm, prompts[1:3], prompts[3])[0], "split_steps": splits}
        busy_llm = LLM(path, device="cuda", dtype="float32", max_num_seqs=MANY_DECODE_ROWS + 1, **state)
        arrived, splits = arrivals(busy_llm, many, many_arriving)
        result["fp32_arrival_beside_many_gpu_vs_cpu"][arch] = {
            "identical": arrived == arrivals(cpu_llm, many, many_arriving)[0], "split_steps": splits}
        del busy_llm
        structured = tokens(gpu_llm, prompts, STRUCTURED)
        result["fp32_structured_gpu_vs_cpu"][arch] = {"identical": structured == tokens(cpu_llm, prompts, STRUCTURED)}
        result["graph_vs_eager_bf16_structured"][arch] = {"identical": structured_pair[0] == structured_pair[1]}
        result["graph_vs_eager_bf16_shrinking_batch"][arch] = {"identical": shrinking_pair[0] == shrinking_pair[1]}
        adjusted = tokens(gpu_llm, prompts, ADJUSTED)
        result["fp32_adjusted_gpu_vs_cpu"][arch] = {"identical": adjusted == tokens(cpu_llm, prompts, ADJUSTED)}
        result["graph_vs_eager_bf16_adjusted"][arch] = {"identical": adjusted_pair[0] == adjusted_pair[1]}
        result["fp32_dead_end_beside_decoding"][arch] = dead_end_beside(gpu_llm, prompts)
        thinking = tokens(gpu_llm, thinking_prompts, THINKING)
        result["fp32_thinking_budget_gpu_vs_cpu"][arch] = {
            "identical": thinking == tokens(cpu_llm, thinking_prompts, THINKING),
            "ends_where_due": ends_where_due(thinking, tags)}
        result["graph_vs_eager_bf16_thinking_budget"][arch] = {"identical": thinking_pair[0] == thinking_pair[1]}
        result["fp32_named_logprobs_and_repetition_gpu_vs_cpu"][arch] = named_and_looping(gpu_llm, cpu_llm, prompts)
        result["fp32_beam_search_gpu_vs_cpu"][arch] = beams_alike(gpu_llm, cpu_llm, prompts)
        if arch in MTP_ARCHITECTURES:
            result["speculative_mtp_gpu_vs_cpu"][arch] = speculative_alike(path, cpu_llm, prompts, state)
        result["prompt_lookup_gpu_vs_cpu"][arch] = prompt_lookup_alike(path, cpu_llm, prompts, state)
        penalised = tokens(gpu_llm, prompts, PENALISED)
        result["fp32_penalised_gpu_vs_cpu"][arch] = {"identical": penalised == tokens(cpu_llm, prompts, PENALISED)}
        result["fp32_gpu_vs_cpu"][arch] = {"identical": gpu == cpu,
                                           "matching_tokens": sum(a == b for x, y in zip(gpu, cpu) for a, b in zip(x, y)),
                                           "total_tokens": sum(len(x) for x in cpu)}
        result["graph_vs_eager_bf16"][arch] = {"identical": graph == eager}
        result["graph_vs_eager_bf16_mixed_sampling"][arch] = {"identical": graph_mixed == eager_mixed}
        result["graph_vs_eager_bf16_top_p_min_p_sampling"][arch] = {"identical": graph_nucleus == eager_nucleus}
        print(arch, *(result[key].get(arch) for key in list(result)[-23:]), flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
