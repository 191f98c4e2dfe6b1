"""logprobs_mode (vLLM's engine argument and --logprobs-mode): what a generated token's logprobs report. raw_logits
are the model's own logits (the reference's); processed_logits are those the token is drawn from, after its
logit_bias, penalties, temperature, top-k and top-p, from which the seeded draw itself can be replayed;
processed_logprobs their log-softmax. The mode changes no token."""

import random

import pytest
import torch

from deltaserve import LLM, SamplingParams
from deltaserve.cli import _build_parser
from deltaserve.engine.engine_config import EngineConfig
from deltaserve.errors import DeltaServeError
from deltaserve.kernels.sampling.reference import mask_logits, penalise, race
from deltaserve.runner.sampler import row_seed
from deltaserve.sampling_params import LOGPROBS_MODES
from deltaserve.server.launcher import engine_kwargs
from tests.checkpoints import VOCAB


@pytest.fixture(scope="module")
def engines(checkpoint_factory):
    path = checkpoint_factory("llama")
    return path, {mode: LLM(path, device="cpu", max_logprobs=-1, logprobs_mode=mode) for mode in LOGPROBS_MODES}


def _row(entry: dict) -> torch.Tensor:
    """A whole-vocabulary logprob entry (logprobs=-1) as a [VOCAB] tensor."""
    row = torch.empty(VOCAB)
    for token, logprob in entry.items():
        row[token] = logprob.logprob
    return row


def _sampled_params(greedy: bool) -> SamplingParams:
    bias = {t: random.uniform(-3, 3) for t in random.sample(range(VOCAB), 5)}
    if greedy:
        return SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=-1, logit_bias=bias,
                              repetition_penalty=1.4)
    return SamplingParams(max_tokens=8, temperature=random.uniform(0.5, 1.5), top_k=random.randint(5, 60),
                          top_p=random.uniform(0.5, 0.95), seed=random.randrange(2**31), ignore_eos=True,
                          logprobs=-1, logit_bias=bias, repetition_penalty=1.4)


def test_raw_logits_are_the_models_logits(engines):
    from tests.reference import load_reference

    path, llms = engines
    prompt = [random.randrange(3, VOCAB) for _ in range(random.randint(2, 30))]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=-1)
    out = llms["raw_logits"].generate([prompt], params, use_tqdm=False)[0].outputs[0]
    with torch.no_grad():
        logits = load_reference(path)(torch.tensor([prompt + out.token_ids])).logits[0].float()
    for i, entry in enumerate(out.logprobs):
        assert torch.allclose(_row(entry), logits[len(prompt) - 1 + i], atol=1e-4, rtol=0)
    raw = llms["raw_logprobs"].generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert raw.token_ids == out.token_ids
    for entry, logit_entry in zip(raw.logprobs, out.logprobs):
        assert torch.allclose(_row(entry), torch.log_softmax(_row(logit_entry), -1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("greedy", [False, True])
def test_processed_logits_are_those_the_token_is_drawn_from(engines, greedy):
    """From the raw logits of the same run: the bias added, the repetition penalty over prompt and output, then
    (a sampled row) the temperature, top-k and top-p; the seeded race over them picks the token."""
    _, llms = engines
    prompt = [random.randrange(3, VOCAB) for _ in range(random.randint(2, 30))]
    params = _sampled_params(greedy)
    runs = {mode: llms[mode].generate([prompt], params, use_tqdm=False)[0].outputs[0] for mode in LOGPROBS_MODES}
    tokens = runs["raw_logprobs"].token_ids
    assert all(run.token_ids == tokens for run in runs.values())  # the mode changes no token
    for i, token in enumerate(tokens):
        raw = _row(runs["raw_logits"].logprobs[i])
        for t, b in params.logit_bias.items():
            raw[t] += b
        seen = torch.zeros(1, VOCAB, dtype=torch.bool)
        seen[0, prompt] = True
        counts = torch.zeros(1, VOCAB)
        for t in tokens[:i]:
            counts[0, t] += 1
        one = torch.ones(1)
        expected = penalise(raw[None], seen, counts, one * 1.4, one * 0, one * 0)
        if not greedy:
            expected = mask_logits(expected * (1.0 / torch.tensor([params.temperature]))[:, None],
                                   torch.tensor([params.top_k]), torch.tensor([params.top_p]), torch.zeros(1))
        expected = expected[0]
        processed = _row(runs["processed_logits"].logprobs[i])
        kept = expected > float("-inf")
        assert torch.equal(processed > float("-inf"), kept)
        assert torch.allclose(processed[kept], expected[kept], atol=1e-5, rtol=0)
        if greedy:
            assert processed.argmax().item() == token
        else:
            assert 1 <= kept.sum() <= params.top_k  # top-p may keep the best token alone
            assert race(processed[None], torch.tensor([row_seed(params.seed, 0, i)])).item() == token
        logprobs = _row(runs["processed_logprobs"].logprobs[i])
        assert torch.allclose(logprobs[kept], torch.log_softmax(processed, -1)[kept], atol=1e-5, rtol=0)
        assert torch.all(logprobs[~kept] == float("-inf"))


def test_the_mode_is_a_flag_and_an_unknown_one_is_refused():
    mode = random.choice(LOGPROBS_MODES)
    assert engine_kwargs(_build_parser().parse_args(["serve", "--logprobs-mode", mode]))["logprobs_mode"] == mode
    with pytest.raises(SystemExit):
        _build_parser().parse_args(["serve", "--logprobs-mode", "logits"])
    with pytest.raises(DeltaServeError, match="logprobs_mode='logits': give one of raw_logprobs"):
        EngineConfig(logprobs_mode="logits")
