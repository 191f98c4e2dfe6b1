"""max_logprobs (vLLM's engine argument and --max-logprobs): the most logprobs a request may ask a token. Past it
a request is refused by the name of its field; under a raised cap each token carries that many, the model's own
as the reference ranks them, and -1 asks for the whole vocabulary."""

import random

import pytest
import torch

from deltaserve import LLM, SamplingParams
from deltaserve.outputs import Logprob
from deltaserve.errors import DeltaServeError, InvalidSamplingParamsError
from tests.checkpoints import VOCAB


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    from tests.checkpoints import make_checkpoint

    return LLM(make_checkpoint("llama", str(tmp_path_factory.mktemp("capped"))), device="cpu")


def test_logprobs_past_the_cap_are_refused_by_name_and_the_engine_serves_on(capped):
    prompt = [random.randrange(3, 300) for _ in range(random.randint(1, 20))]
    over = random.randint(21, VOCAB)
    cases = [(dict(logprobs=over), f"logprobs={over}: asks for {over} logprobs a token, .*max_logprobs of 20"),
             (dict(prompt_logprobs=over), f"prompt_logprobs={over}: .*max_logprobs of 20"),
             (dict(logprobs=-1), f"logprobs=-1: asks for {VOCAB} logprobs a token")]
    for fields, message in cases:
        with pytest.raises(InvalidSamplingParamsError, match=message):
            capped.generate([prompt], SamplingParams(max_tokens=2, **fields), use_tqdm=False)
    with pytest.raises(InvalidSamplingParamsError, match="logprobs=-2: must be at least 0, or -1"):
        SamplingParams(logprobs=-2)
    out = capped.generate([prompt], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=20,
                                                   prompt_logprobs=20), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 3 and all(len(e) >= 20 for e in out.outputs[0].logprobs)
    assert not capped.engine.has_unfinished_requests()


def test_max_logprobs_itself_is_checked():
    from deltaserve.engine.engine_config import EngineConfig

    for wrong in (-2, 1.5, "20", True):
        with pytest.raises(DeltaServeError, match="max_logprobs"):
            EngineConfig(max_logprobs=wrong)


def _assert_the_references_best(entry: dict, row: torch.Tensor, count: int) -> None:
    """entry holds `count` top tokens (beside the chosen one) whose logprobs are the reference row's, and no token
    left out lies above the lowest of them by more than rounding."""
    top = {t: e for t, e in entry.items() if e.rank <= count}
    assert len(top) == count
    assert sorted(e.rank for e in top.values()) == list(range(1, count + 1))
    for token, e in entry.items():
        assert abs(e.logprob - row[token].item()) < 1e-4
    left_out = [t for t in range(VOCAB) if t not in top]
    if left_out:
        assert row[left_out].max().item() <= min(e.logprob for e in top.values()) + 1e-4


def test_a_raised_cap_gives_each_token_that_many_as_the_reference_ranks_them(checkpoint_factory):
    from tests.reference import load_reference

    path = checkpoint_factory("qwen3.5")
    llm = LLM(path, device="cpu", max_logprobs=-1)
    prompt = [random.randrange(3, 300) for _ in range(random.randint(2, 20))]
    count = random.randint(21, VOCAB - 1)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=count, prompt_logprobs=-1)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    sample = out.outputs[0]
    with torch.no_grad():
        logits = load_reference(path)(torch.tensor([prompt + sample.token_ids])).logits[0]
    expected = torch.log_softmax(logits, -1)
    for i, entry in enumerate(sample.logprobs):
        _assert_the_references_best(entry, expected[len(prompt) - 1 + i], count)
    for position in range(1, len(prompt)):  # -1: every token of the vocabulary, each prompt position
        assert len(out.prompt_logprobs[position]) == VOCAB
        _assert_the_references_best(out.prompt_logprobs[position], expected[position - 1], VOCAB)



def test_named_tokens_come_with_their_logprobs_and_ranks(checkpoint_factory):
    """vLLM's logprob_token_ids: each position carries the sampled token's logprob and those of the named
    tokens, equal to the whole vocabulary's entries at those ids (logprobs=-1 on the same greedy run)."""
    llm = LLM(checkpoint_factory("qwen3.5"), device="cpu", max_logprobs=-1)
    prompt = [random.randrange(300) for _ in range(random.randint(2, 12))]
    named = random.sample(range(300), random.randint(1, 6))
    greedy = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    every = llm.generate([prompt], SamplingParams(logprobs=-1, **greedy))[0].outputs[0]
    some = llm.generate([prompt], SamplingParams(logprob_token_ids=named, **greedy))[0].outputs[0]
    assert some.token_ids == every.token_ids
    for token, entry, whole in zip(some.token_ids, some.logprobs, every.logprobs):
        assert set(entry) == {token, *named}
        for tid, logprob in entry.items():
            assert abs(logprob.logprob - whole[tid].logprob) < 1e-5 and logprob.rank == whole[tid].rank
    with pytest.raises(InvalidSamplingParamsError, match="logprob_token_ids=.*outside the vocabulary"):
        llm.generate([prompt], SamplingParams(max_tokens=2, logprob_token_ids=[10**6]))


def test_ranks_count_the_tokens_at_least_as_likely_and_the_top_ones_rank_in_order():
    """As vLLM's: a token's rank counts the tokens whose logprob is at least its own (a tie ranks behind its
    equals), the top tokens take ranks 1..k in their order (the sampled one too, where among them), and named
    tokens stand in the top ones' stead."""
    from deltaserve.runner.sampler import logprob_entry

    rng = random.Random()
    row = torch.log_softmax(torch.randn(64), -1)
    tied = rng.sample(range(64), 3)
    row[tied] = row[tied[0]].item()
    for token in (tied[1], rng.randrange(64)):
        alone = logprob_entry(row, token, 0)
        assert alone == {token: Logprob(row[token].item(), int((row >= row[token]).sum()))}
        top = rng.randint(1, 8)
        entry = logprob_entry(row, token, top)
        best = row.topk(top)
        for rank, tid in enumerate(best.indices.tolist(), start=1):
            assert entry[tid].rank == rank
        if token not in best.indices.tolist():
            assert entry[token] == alone[token] and len(entry) == top + 1
        named = rng.sample(range(64), 4)
        entry = logprob_entry(row, token, len(named), named)
        assert set(entry) == {token, *named}
        assert all(entry[t].rank == int((row >= row[t]).sum()) for t in named)


def test_logprobs_beside_named_tokens_must_count_them():
    named = random.sample(range(300), random.randint(1, 6))
    assert SamplingParams(logprob_token_ids=named, logprobs=len(named)).logprobs == len(named)
    with pytest.raises(InvalidSamplingParamsError, match="logprobs must equal their number"):
        SamplingParams(logprob_token_ids=named, logprobs=len(named) + 1)
