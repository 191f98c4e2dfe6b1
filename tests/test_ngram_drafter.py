"""Prompt lookup (speculative method "ngram"): the drafts are the tokens after the earliest earlier occurrence of
the longest suffix n-gram within prompt_lookup_min..max; a drafting engine gives plain greedy decoding's tokens on
plain attention and hybrid models, with drafts kept and refuted, and on the demo model copying a sentence; vLLM's
config fields and defaults, and the command line's."""

import random

import numpy as np
import pytest

from deltaserve import LLM, SamplingParams
from deltaserve.engine.speculative_config import SpeculativeConfig
from deltaserve.errors import DeltaServeError
from deltaserve.runner.ngram_drafter import lookup
from tests.arrivals import arrival_requests, arrivals
from tests.checkpoints import VOCAB
from tests.read_off_drafts import read_off_drafts
from tests.uncaptured_graphs import recorded_splits, with_uncaptured_graphs


def _reference(tokens: list[int], shortest: int, longest: int, count: int) -> list[int]:
    """By the definition, one candidate at a time."""
    for n in range(longest, shortest - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[len(tokens) - n:]
        for start in range(len(tokens) - n):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + count]
    return []


def test_lookup_takes_the_longest_suffix_seen_before_at_its_earliest_place():
    rng = random.Random()
    for _ in range(300):
        alphabet = rng.randint(2, 6)  # few distinct tokens: many matches, of every length
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(1, 40))]
        shortest = rng.randint(1, 4)
        longest = rng.randint(shortest, 6)
        count = rng.randint(1, 5)
        got = lookup(np.asarray(tokens, dtype=np.int64), shortest, longest, count)
        assert got == _reference(tokens, shortest, longest, count), (tokens, shortest, longest, count)


def test_lookup_finds_nothing_in_tokens_that_never_repeat():
    assert lookup(np.arange(30, dtype=np.int64), 1, 5, 3) == []
    assert lookup(np.asarray([7], dtype=np.int64), 1, 5, 3) == []


def test_the_drafter_looks_up_the_tokens_through_the_one_its_step_sampled():
    """A verify chunk's kept drafts (not in the output yet) and the step's token end the tokens looked up, as do a
    decode row's token and a prompt's last chunk's first token; a chunk that does not sample drafts nothing."""
    from deltaserve.engine.request import Request
    from deltaserve.engine.step_plan import ScheduledChunk
    from deltaserve.runner.mtp_drafter import DraftRequest
    from deltaserve.runner.ngram_drafter import NgramDrafter

    drafter = NgramDrafter(3, 1, 3)
    request = Request("r", [5, 6, 7, 8, 9, 10], SamplingParams(temperature=0), max_tokens=64)
    request.output_token_ids = [4]
    request.num_computed_tokens = 6
    verify = ScheduledChunk(request, 6, 3, [8, 6])
    verify.keep_verified(1)  # rows for 4 and its kept draft 8; the step's token after them is 9
    assert drafter.propose(None, [DraftRequest(verify, 0, 9, True)]) == {request: [10, 4, 8]}  # ... 8 9 -> 10 4 8
    decode = ScheduledChunk(request, 6, 1)  # the row for 4; the step's token is 9
    assert drafter.propose(None, [DraftRequest(decode, 0, 9, True)]) == {request: [10, 4, 9]}  # ... 9 -> 10 4 9
    prompt = Request("p", [1, 2, 3, 1, 2], SamplingParams(temperature=0), max_tokens=64)
    last = ScheduledChunk(prompt, 3, 2)  # the prompt's last chunk; its first token is 3
    assert drafter.propose(None, [DraftRequest(last, 0, 3, True)]) == {prompt: [1, 2, 3]}  # 1 2 3 -> 1 2 3 ...
    assert drafter.propose(None, [DraftRequest(ScheduledChunk(prompt, 0, 3), 0, 1, False)]) == {}


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.mark.parametrize("arch", ["llama", "qwen3.5"])
def test_prompt_lookup_keeps_plain_greedy_outputs(arch, checkpoint_factory):
    path = checkpoint_factory(arch)
    plain = LLM(path, device="cpu", max_num_seqs=8)
    rng = random.Random()
    base = [rng.randrange(3, VOCAB) for _ in range(rng.randint(4, 12))]
    every = rng.sample(range(3, VOCAB), VOCAB - 3)  # whatever a sequence's last token, it stood before: lookups hit
    prompts = [base * 3, every + base[: len(base) // 2] * 2, [rng.randrange(3, VOCAB) for _ in range(20)] + every]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    for with_oracle in (False, True):
        llm = LLM(path, device="cpu", max_num_seqs=8, speculative_config=NGRAM)
        if with_oracle:
            read_off_drafts(llm, prompts, expected, rng)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert got == expected, with_oracle
        stats = llm.engine.stats()
        assert stats.spec_decode_num_drafts > 0  # the repeated prompts' n-grams draft
        if with_oracle:
            assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


@pytest.mark.parametrize("arch", ["llama", "qwen3.5"])
def test_sequences_with_and_without_a_match_share_the_verify_graphs(arch, checkpoint_factory):
    """Beside a sequence whose lookups hit, one whose tokens seldom repeat has no drafts: both stay in the verify
    graphs' layout (uncaptured on the CPU, so run eagerly), the draftless one padded to k + 1 rows that change
    nothing (on Qwen3.5 its GDN state set back past them); a step where no sequence drafts replays a plain decode
    graph. The tokens are plain greedy decoding's throughout."""
    path = checkpoint_factory(arch)
    plain = LLM(path, device="cpu", max_num_seqs=8)
    rng = random.Random()
    every = rng.sample(range(3, VOCAB), VOCAB - 3)  # whatever its last token, it stood before: lookups hit
    prompts = [every, rng.sample(range(3, VOCAB), 3), every[::-1]]  # the middle one's rarely do at first
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    llm = LLM(path, device="cpu", max_num_seqs=8, speculative_config=NGRAM)
    steps = with_uncaptured_graphs(llm.engine)
    read_off_drafts(llm, prompts, expected, rng)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    assert any(1 in step and max(step) > 1 for step in steps.verify)  # a draftless sequence beside drafting ones
    assert llm.engine.stats().spec_decode_num_accepted_tokens > 0
    assert [o.outputs[0].token_ids for o in llm.generate(prompts[1:2], params, use_tqdm=False)] == expected[1:2]
    assert steps.decode  # its first step at least found nothing to draft


def test_a_prefix_cache_hit_restores_into_a_decode_graph_step(checkpoint_factory):
    """A prompt sent again restores the GDN state its first run saved a token before its end (snapshots every
    block), so its first step is one decode row with a restore: it replays a decode graph (uncaptured on the CPU),
    the restore run before it, and gives the first run's tokens, which are plain greedy decoding's."""
    path = checkpoint_factory("qwen3.5")
    prompt = [random.randrange(3, VOCAB) for _ in range(33)]  # a snapshot at 32: one token left to compute
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = LLM(path, device="cpu").generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    llm = LLM(path, device="cpu", block_size=16, ssm_snapshot_interval=16,
              speculative_config={**NGRAM, "prompt_lookup_min": 2})
    steps = with_uncaptured_graphs(llm.engine)
    restoring, plainly = [], llm.engine.runner._replayable

    def noting(plan):
        taken = plainly(plan)
        restoring.append(taken and bool(plan.restores))  # a decode graph step with a restore
        return taken

    llm.engine.runner._replayable = noting
    for _ in range(2):
        assert llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids == want
    assert any(restoring) and steps.decode


def _noting_snapshot_points(replayable, prompt: list[int], positions: list[int]):
    """replayable, noting the snapshot points of `prompt`'s request that a verify graph step reaches."""

    def noting(plan):
        taken = replayable(plan)
        if taken:
            positions.extend(c.position for c in plan.captures if c.chunk.request.prompt_token_ids == prompt)
        return taken

    return noting


def test_a_decode_snapshot_taken_in_a_verify_graph_step_is_the_sequences_own_state(checkpoint_factory):
    """A draftless sequence crossing a decode snapshot point beside a drafting one: the verify graph step pads it,
    and its snapshot is saved once its state is set back past the padding rows, so a follow-up restoring from it
    gives plain greedy decoding's tokens."""
    path = checkpoint_factory("qwen3.5")
    rng = random.Random()
    every = rng.sample(range(3, VOCAB), VOCAB - 3)  # its lookups always hit
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for _ in range(8):  # a quiet prompt whose output, as it happens, finds drafts at no snapshot point is drawn again
        quiet = rng.sample(range(3, VOCAB), 30)  # its lookups seldom hit
        llm = LLM(path, device="cpu", block_size=16, decode_snapshot_interval=16, speculative_config=NGRAM)
        with_uncaptured_graphs(llm.engine)
        graphs = llm.engine.runner.speculative.graphs
        captured_at = []
        graphs.replayable = _noting_snapshot_points(graphs.replayable, quiet, captured_at)
        first = [o.outputs[0].token_ids for o in llm.generate([every, quiet], params, use_tqdm=False)][1]
        if captured_at:
            break
    assert captured_at  # 32 or 48, where the quiet sequence had no drafts
    point = captured_at[-1]
    follow_up = [quiet + first[: point - len(quiet) + 3]]  # restores the snapshot at `point`
    want = LLM(path, device="cpu").generate(follow_up, params, use_tqdm=False)[0].outputs[0].token_ids
    hits = llm.engine.stats().prefix_cache_hits
    assert llm.generate(follow_up, params, use_tqdm=False)[0].outputs[0].token_ids == want
    assert llm.engine.stats().prefix_cache_hits - hits == point


@pytest.mark.parametrize("arch", ["llama", "qwen3.5"])
def test_a_prompt_arriving_beside_drafting_sequences_replays_its_prefill_graph(arch, checkpoint_factory):
    """A prompt that arrives while sequences decode with drafts runs as its own prefill graph after their verify
    graph (uncaptured on the CPU, so run eagerly in the graphs' layouts), as a plain engine splits a step; beside
    sequences without drafts it follows their decode graph, and alone it is a prefill graph; a prefix-cache hit
    restores inside its graph. The tokens are plain greedy decoding's, and seeded sampled rows are those of
    eager steps."""
    path = checkpoint_factory(arch)
    rng = random.Random()
    prompts, greedy, expected, seeded = arrival_requests(LLM(path, device="cpu", max_num_seqs=8), rng, 24)
    seed, runs = rng.randrange(2**31), []
    for in_graphs in (False, True):
        llm = LLM(path, device="cpu", max_num_seqs=8, block_size=16, speculative_config=NGRAM)
        steps, splits = (with_uncaptured_graphs(llm.engine), recorded_splits(llm.engine)) if in_graphs else (None, None)
        read_off_drafts(llm, list(prompts.values()), list(expected.values()), random.Random(seed))
        runs.append((arrivals(llm, prompts, greedy), arrivals(llm, prompts, seeded)))
    assert runs[0][0] == expected and runs[1] == runs[0]
    assert splits and all(beside for beside, _ in splits)  # prompt lookup's lone prompts run as a plain engine's
    assert steps.decode and len(steps.prefill) > len(splits)  # alone, beside verify and decode graphs
    assert llm.engine.stats().prefix_cache_hits > 0


def test_prompt_lookup_needs_no_head_and_vllms_defaults_hold():
    assert SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 2}) == SpeculativeConfig(
        2, "ngram", 5, 5)
    assert SpeculativeConfig.from_value({"method": "[ngram]", "num_speculative_tokens": 4,
                                         "prompt_lookup_max": 3}) == SpeculativeConfig(4, "ngram", 3, 3)
    assert SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 1,
                                         "prompt_lookup_min": 2}) == SpeculativeConfig(1, "ngram", 2, 2)
    assert not SpeculativeConfig(1, "ngram", 2, 2).drafts_with_head


@pytest.mark.parametrize("config, named", [
    ({"method": "ngram"}, "needs num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min=4 must be at most prompt_lookup_max=2"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "prompt_lookup_max=0"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x/y"}, "model"),
])
def test_a_prompt_lookup_config_deltaserve_cannot_run_is_refused_by_name(config, named):
    with pytest.raises(DeltaServeError, match=named.replace("[", r"\[")):
        SpeculativeConfig.from_value(config)


def test_the_demo_model_drafts_by_prompt_lookup_and_answers_as_without(demo_llm):
    """SmolLM2 (a llama GGUF, no head of its own) asked to repeat a sentence: its reply copies the prompt, so the
    lookups hit and drafts are kept, and the greedy reply is the one plain decoding gives."""
    llm = LLM(device="cpu", speculative_config=NGRAM)
    sentence = "The quick brown fox jumps over the lazy dog near the old river bank at dawn."
    messages = [[{"role": "user", "content": f"Repeat this sentence exactly, nothing else: {sentence}"}]]
    params = SamplingParams(temperature=0, max_tokens=32)
    want = demo_llm.chat(messages, params, use_tqdm=False)[0].outputs[0]
    got = llm.chat(messages, params, use_tqdm=False)[0].outputs[0]
    assert got.token_ids == want.token_ids
    assert llm.engine.stats().spec_decode_num_accepted_tokens > 0, want.text


def test_the_command_line_takes_prompt_lookup():
    from deltaserve.cli import _parse
    from deltaserve.server.launcher import engine_kwargs

    args = _parse(["serve", "-sc", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'])
    config = SpeculativeConfig.from_value(engine_kwargs(args)["speculative_config"])
    assert config == SpeculativeConfig(3, "ngram", 4, 4)
