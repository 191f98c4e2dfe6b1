"""Beam search (engine/beam_search.py, LLM.beam_search): the search against a plain statement of vLLM's rule on
drawn logprobs, and the engine's beams against that rule run over transformers' own logprobs."""

from __future__ import annotations

import math
import random

import pytest
import torch

from deltaserve import LLM, BeamSearchParams, InvalidSamplingParamsError, StructuredOutputsParams
from deltaserve.engine.beam_search import BeamSearch
from deltaserve.outputs import Logprob
from tests.reference import load_reference

pytestmark = pytest.mark.timeout(600)

VOCAB = 7  # the drawn distributions' tokens: 0 is the primary end of sequence, 1 another end
EOS, OTHER_EOS = 0, 1


def _drawn_logprobs(seed: int, prefix: tuple[int, ...]) -> list[float]:
    """A distribution over VOCAB tokens fixed by (seed, prefix): the model a search runs over."""
    rng = random.Random(f"{seed}:{prefix}")
    logits = [rng.gauss(0.0, 2.0) for _ in range(VOCAB)]
    top = max(logits)
    norm = top + math.log(sum(math.exp(x - top) for x in logits))
    return [x - norm for x in logits]


def _entry(logprobs: list[float], count: int) -> dict[int, Logprob]:
    """What an engine request returns for a position: its `count` likeliest tokens, by rank."""
    order = sorted(range(len(logprobs)), key=lambda t: -logprobs[t])
    return {t: Logprob(logprobs[t], rank) for rank, t in enumerate(order[:count], start=1)}


def _rule(prompt_len: int, logprobs_of, params: BeamSearchParams, eos: set[int]) -> list[tuple]:
    """vLLM's beam search as its offline loop states it, run to max_tokens: every live beam's 2 * width likeliest
    tokens extend it; those a stop token ends are finished (unless min_tokens holds them back, when they are not
    taken at all), the best `width` others by score live on; at the end the best `width` of all finished and live.
    Returns (tokens, cumulative logprob, finish reason) of each, best first."""
    width, penalty = params.beam_width, params.length_penalty

    def score(item):
        tokens, cum, reason = item
        return cum / ((prompt_len + len(tokens) - (reason == "stop")) ** penalty)

    live, done = [((), 0.0, None)], []
    for _ in range(params.max_tokens):
        growing = []
        for tokens, cum, _ in live:
            logprobs = logprobs_of(tokens)
            for token in sorted(range(len(logprobs)), key=lambda t: -logprobs[t])[:2 * width]:
                child = (tokens + (token,), cum + logprobs[token])
                stops = token in params.stop_token_ids or (token in eos and not params.ignore_eos)
                if (token in params.stop_token_ids or token in eos) and len(child[0]) <= params.min_tokens:
                    continue
                (done if stops else growing).append((*child, "stop" if stops else None))
        live = sorted(growing, key=score, reverse=True)[:width]
    finished = done + [(tokens, cum, "length") for tokens, cum, _ in live]
    return sorted(finished, key=score, reverse=True)[:width]


def _run(search: BeamSearch, logprobs_of) -> None:
    while not search.finished:
        search.advance([_entry(logprobs_of(tuple(p[len(search.prompt):])), search.candidates_per_beam)
                        for p in search.next_prompts()])


def test_the_search_keeps_vllms_rule_on_drawn_logprobs():
    """Many fresh searches over drawn distributions: the same beams, logprobs and finish reasons as the rule, where
    the search also stops early once no live beam can overtake the finished ones (which the rule never does)."""
    stopped_early = 0
    for _ in range(300):
        seed = random.randrange(10**9)
        rng = random.Random(seed)
        params = BeamSearchParams(beam_width=rng.randint(1, 3), max_tokens=rng.randint(1, 9),
                                  length_penalty=rng.choice([-0.5, 0.0, 0.6, 1.0, 2.0]),
                                  ignore_eos=rng.random() < 0.2, min_tokens=rng.choice([0, 0, 1, 3]),
                                  stop_token_ids=rng.choice([[], [4]]))
        prompt = [rng.randrange(100) for _ in range(rng.randint(1, 5))]
        logprobs_of = lambda prefix: _drawn_logprobs(seed, prefix)  # noqa: E731
        search = BeamSearch(prompt, params, {EOS, OTHER_EOS}, EOS)
        _run(search, logprobs_of)
        got = [(tuple(b.tokens), b.cum_logprob, b.finish_reason) for b in search.best()]
        assert got == _rule(len(prompt), logprobs_of, params, {EOS, OTHER_EOS}), (seed, params)
        for beam in search.best():  # the stop reason as the engine gives it: none for the primary end
            last = beam.tokens[-1]
            expected = None if beam.finish_reason == "length" or (last == EOS and not params.ignore_eos) else last
            assert beam.stop_reason == expected, (seed, params)
        stopped_early += search.steps < params.max_tokens
    assert stopped_early > 10  # the early stop was taken, and gave the rule's beams


def test_any_length_penalty_ranks_and_logits_never_stop_early():
    """A length penalty whose length ** penalty leaves float's range still ranks (the sum over an infinite
    length is 0), and where the values are logits (a logits logprobs_mode), which may rise, the search runs every
    step."""
    seed = random.randrange(10**9)
    logprobs_of = lambda prefix: _drawn_logprobs(seed, prefix)  # noqa: E731
    for penalty in (1000.0, -1000.0, 1e10, -1e10):
        search = BeamSearch([1, 2, 3], BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=penalty),
                            {EOS}, EOS)
        _run(search, logprobs_of)
        assert len(search.best()) == 2 and all(b.finish_reason in ("stop", "length") for b in search.best())
    rising = lambda prefix: [abs(x) + 5 for x in _drawn_logprobs(seed, prefix)]  # noqa: E731
    params = BeamSearchParams(beam_width=1, max_tokens=6, length_penalty=0.0)
    search = BeamSearch([1], params, {EOS, OTHER_EOS}, EOS, logprobs_fall=False)
    _run(search, rising)
    assert search.steps == params.max_tokens or not search.live
    assert [(tuple(b.tokens), b.cum_logprob) for b in search.best()] == [
        (t, c) for t, c, _ in _rule(1, rising, params, {EOS, OTHER_EOS})]


@pytest.fixture(scope="module")
def qwen(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    return LLM(path, device="cpu", max_num_seqs=8), load_reference(path)


def _reference_logprobs(model, prompt: list[int]):
    cache: dict[tuple, list[float]] = {}

    def logprobs_of(prefix: tuple[int, ...]) -> list[float]:
        if prefix not in cache:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
            cache[prefix] = torch.log_softmax(logits.double(), -1).tolist()
        return cache[prefix]

    return logprobs_of


def _narrowest_gap(prompt_len: int, logprobs_of, params: BeamSearchParams, beams: list[tuple]) -> float:
    """The smallest score difference at any cut the rule made along these beams' paths: where two candidates
    differ by less than the engine's fp32 rounding, either may be kept."""
    width, gaps = params.beam_width, []
    prefixes = {beam[0][:n] for beam in beams for n in range(len(beam[0]))}
    for prefix in prefixes:
        logprobs = sorted(logprobs_of(prefix), reverse=True)
        gaps.append(logprobs[2 * width - 1] - logprobs[2 * width])  # the candidates' own cut
    scores = sorted((cum / ((prompt_len + len(t) - (r == "stop")) ** params.length_penalty) for t, cum, r in beams),
                    reverse=True)
    gaps += [a - b for a, b in zip(scores, scores[1:])]
    return min(gaps)


def test_the_engines_beams_are_the_rules_over_the_reference_model(qwen):
    """Fresh prompts, widths and stop tokens: LLM.beam_search's beams (each step's requests restored from the
    prefix cache's tails) are those of the rule over transformers' logprobs, with their summed logprobs within fp32
    rounding; a search whose candidates nearly tie somewhere is drawn again."""
    llm, model = qwen
    eos = llm.engine.eos_token_ids
    compared = 0
    for _ in range(6):
        prompt = [random.randrange(3, 300) for _ in range(random.randint(3, 20))]
        logprobs_of = _reference_logprobs(model, prompt)
        first = sorted(range(len(logprobs_of(()))), key=lambda t: -logprobs_of(())[t])
        params = BeamSearchParams(beam_width=random.randint(1, 3), max_tokens=random.randint(2, 6),
                                  length_penalty=random.choice([0.0, 1.0, 2.0]), stop_token_ids=[first[2]],
                                  min_tokens=random.choice([0, 1]))
        expected = _rule(len(prompt), logprobs_of, params, eos)
        if _narrowest_gap(len(prompt), logprobs_of, params, expected) < 1e-3:
            continue
        out = llm.beam_search([{"prompt_token_ids": prompt}], params)[0].sequences
        assert [tuple(s.tokens[len(prompt):]) for s in out] == [t for t, _, _ in expected], (prompt, params)
        assert [s.finish_reason for s in out] == [r for _, _, r in expected]
        for seq, (_, cum, _) in zip(out, expected):
            assert seq.cum_logprob == pytest.approx(cum, abs=1e-4 * len(seq.tokens))
            assert seq.tokens[:len(prompt)] == prompt
            assert seq.text == llm.get_tokenizer().decode(seq.tokens, skip_special_tokens=False)
        compared += 1
    assert compared >= 3


def test_a_search_is_checked_before_it_runs(qwen):
    llm, _ = qwen
    with pytest.raises(InvalidSamplingParamsError, match="beam_width=11: each step takes a beam's 22"):
        llm.beam_search(["a"], BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(InvalidSamplingParamsError, match="structured_outputs: beam search takes no grammar"):
        BeamSearchParams(beam_width=2, max_tokens=2, structured_outputs=StructuredOutputsParams(regex="a+"))
    with pytest.raises(InvalidSamplingParamsError, match="stop_token_ids=9999: token id 9999 is outside"):
        llm.beam_search(["a"], BeamSearchParams(beam_width=2, max_tokens=2, stop_token_ids=[9999]))
    # max_tokens is capped by the context the prompt leaves, as generate caps it
    room = llm.engine.max_model_len - 3
    out = llm.beam_search([[5, 6, 7]], BeamSearchParams(beam_width=1, max_tokens=room + 50, ignore_eos=True))
    assert len(out[0].sequences[0].tokens) <= llm.engine.max_model_len


def test_searches_run_together_or_a_few_at_a_time_and_leave_the_engine_idle(qwen):
    llm, _ = qwen
    prompts = [[random.randrange(3, 300) for _ in range(random.randint(2, 9))] for _ in range(3)]
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    together = llm.beam_search(prompts, params)
    one_by_one = llm.beam_search(prompts, params, concurrency_limit=1)
    for a, b, prompt in zip(together, one_by_one, prompts):
        assert len(a.sequences) == 2 and all(s.tokens[:len(prompt)] == prompt for s in a.sequences)
        assert all(len(s.tokens) == len(prompt) + 3 and s.finish_reason == "length" for s in a.sequences)
        assert [s.cum_logprob for s in a.sequences] == pytest.approx([s.cum_logprob for s in b.sequences], abs=1e-4)
    assert not llm.engine.has_unfinished_requests()
