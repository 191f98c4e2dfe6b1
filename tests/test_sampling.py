"""Sampling: seeds reproduce alone and in a batch; the masks and penalties mean what vLLM means."""

import math
import random
import re

import pytest
import torch
from torch.overrides import TorchFunctionMode

from deltaserve import LLM, SamplingParams
from deltaserve.errors import InvalidSamplingParamsError, NoTokenAllowedError
from deltaserve.engine.request import Request
from deltaserve.kernels.sampling.reference import MaskPlan, mask_logits, penalise
from deltaserve.runner.sampler import Sampler, mask_plan
from tests.checkpoints import make_checkpoint


def test_same_seed_same_text_alone_and_in_batch(checkpoint_factory):
    llm = LLM(checkpoint_factory("qwen3.5"), device="cpu")
    rng = random.Random()
    prompts = [[rng.randrange(300) for _ in range(rng.randint(3, 40))] for _ in range(5)]
    seed = rng.randrange(2**31)
    seeded = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True)
    unseeded = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    alone = llm.generate([prompts[0]], seeded)[0].outputs[0]
    mixed = llm.generate(prompts, [seeded] + [unseeded] * 4)[0].outputs[0]
    again = llm.generate([prompts[0]], seeded)[0].outputs[0]
    assert alone.token_ids == mixed.token_ids == again.token_ids
    assert alone.text == mixed.text
    other = llm.generate([prompts[0]], SamplingParams(max_tokens=16, temperature=1.0, seed=seed + 1,
                                                      ignore_eos=True))[0].outputs[0]
    assert other.token_ids != alone.token_ids  # 16 draws from a random model's vocabulary: equal by chance ~never


def test_n_samples_differ_and_count(checkpoint_factory):
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    out = llm.generate([[1, 2, 3]], SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=7, ignore_eos=True))[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1


def test_top_k_one_is_greedy_and_logprobs_are_reported(checkpoint_factory):
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    prompt = [random.randrange(300) for _ in range(10)]
    greedy = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=3))[0]
    topk = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=1.5, top_k=1, ignore_eos=True))[0]
    assert greedy.outputs[0].token_ids == topk.outputs[0].token_ids
    for token, entry in zip(greedy.outputs[0].token_ids, greedy.outputs[0].logprobs):
        assert entry[token].rank == 1 and len(entry) == 3
        assert max(e.logprob for e in entry.values()) == entry[token].logprob


def test_a_tiny_temperature_samples_at_vllms_floor_and_a_huge_top_k_keeps_every_token(checkpoint_factory):
    """vLLM's: a temperature in (0, 0.01) samples at 0.01 (under 1e-5 the logits over it would overflow) and
    only 0 is greedy; past 2 it is refused. k past the vocabulary (any int64) is k off."""
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    prompt = [random.randrange(300) for _ in range(10)]
    seed = random.randrange(2**31)

    def tokens(**fields):
        return llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True, **fields))[0].outputs[0].token_ids

    assert [SamplingParams(temperature=t).temperature for t in (1e-45, 2e-5, 0.0, 0.5)] == [0.01, 0.01, 0.0, 0.5]
    assert tokens(temperature=1e-45, seed=seed) == tokens(temperature=1e-6, seed=seed) == tokens(temperature=0.01,
                                                                                                  seed=seed)
    with pytest.raises(InvalidSamplingParamsError, match=r"temperature=2.01: must be in \[0, 2\]"):
        SamplingParams(temperature=2.01)
    assert tokens(temperature=1.0, seed=seed, top_k=2**63 - 1) == tokens(temperature=1.0, seed=seed)


def test_a_seed_of_minus_one_is_no_seed_and_true_logprobs_ask_one(checkpoint_factory):
    """vLLM's: seed -1 means unseeded (samples differ from run to run), and logprobs / prompt_logprobs True
    ask for one."""
    assert SamplingParams(seed=-1).seed is None
    params = SamplingParams(logprobs=True, prompt_logprobs=True)
    assert (params.logprobs, params.prompt_logprobs) == (1, 1)
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    prompt = [random.randrange(300) for _ in range(6)]
    draws = {tuple(llm.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0, seed=-1, ignore_eos=True),
                                use_tqdm=False)[0].outputs[0].token_ids) for _ in range(3)}
    assert len(draws) > 1  # 12 draws from a random model's vocabulary: equal three times by chance ~never


def test_mask_logits_matches_a_direct_definition():
    rows = 12
    logits = torch.randn(rows, 50) * 2
    top_k = torch.tensor([0, 5, 0, 3] + [random.choice([0, random.randrange(1, 50)]) for _ in range(rows - 4)])
    top_p = torch.tensor([1.0, 1.0, 0.6, 0.9] + [random.choice([1.0, random.uniform(0.1, 0.99)])
                                                 for _ in range(rows - 4)])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.2] + [random.choice([0.0, random.uniform(0.01, 0.5)])
                                                 for _ in range(rows - 4)])
    masked = mask_logits(logits, top_k, top_p, min_p)
    for row in range(rows):
        keep = _direct_keep(logits[row], int(top_k[row]), float(top_p[row]), float(min_p[row]))
        assert torch.equal(torch.isfinite(masked[row]), keep)
    # min-p first: of 0.4, 0.3 and thirty tokens of 0.01 it keeps the two, and top-p 0.5 of those (0.57, 0.43)
    # keeps the first alone, where top-p over the whole row (0.4 before the second) would keep both
    row = torch.tensor([0.4, 0.3] + [0.01] * 30).log()[None]
    kept = mask_logits(row, torch.tensor([0]), torch.tensor([0.5]), torch.tensor([0.1]))
    assert torch.isfinite(kept[0]).nonzero().flatten().tolist() == [0]


def test_mask_logits_of_top_k_candidates_matches_the_whole_sort():
    """Where every row has top-k on, masking its best `candidates` tokens (torch.topk) keeps what sorting
    the whole vocabulary keeps, with top-p and min-p beside top-k in some rows; a greedy row's argmax stays."""
    rows, vocab = 6, 3000
    logits = torch.randn(rows, vocab) * 2
    while any(row.unique().numel() < vocab for row in logits):  # tied logits may be kept either way by either
        logits = torch.randn(rows, vocab) * 2
    top_k = torch.tensor([random.randrange(1, 200) for _ in range(rows)])
    top_p = torch.tensor([random.choice([1.0, random.uniform(0.2, 0.99)]) for _ in range(rows)])
    min_p = torch.tensor([random.choice([0.0, random.uniform(0.0, 0.3)]) for _ in range(rows)])
    candidates = int(top_k.max())
    whole = mask_logits(logits, top_k, top_p, min_p)
    assert torch.equal(mask_logits(logits, top_k, top_p, min_p, candidates), whole)
    top_k[0] = 0  # a greedy row beside them: off, it keeps its best candidates, its argmax among them
    assert mask_logits(logits, top_k, top_p, min_p, candidates)[0].argmax() == logits[0].argmax()


def test_mask_plan_follows_the_sampled_rows():
    greedy = SamplingParams(temperature=0, top_p=0.5, top_k=3)
    assert mask_plan([greedy, SamplingParams(temperature=1.0)], 100) == MaskPlan(min_p=False)
    assert mask_plan([greedy, SamplingParams(temperature=1.0, top_k=20, top_p=0.9),
                      SamplingParams(temperature=0.5, top_k=7, min_p=0.2)], 100) == MaskPlan(20, True, min_p=False)
    assert mask_plan([SamplingParams(temperature=1.0, top_k=500)], 100) == MaskPlan(100, True, greedy_rows=False,
                                                                                     min_p=False)
    assert mask_plan([SamplingParams(temperature=1.0, top_k=20), SamplingParams(temperature=1.0, min_p=0.1)],
                     100) == MaskPlan(20, False, True, False)
    assert mask_plan([SamplingParams(temperature=1.0, top_k=20), SamplingParams(temperature=1.0)],
                     100) == MaskPlan(20, False, False, False, False)
    assert mask_plan([SamplingParams(temperature=1.0, top_p=0.9), greedy], 100) == MaskPlan(0, False, True,
                                                                                             min_p=False)
    assert not mask_plan([greedy], 100).masks


def _direct_keep(row, k, p, min_p):
    """vLLM's order: top-k, then min-p against the best token's probability, then top-p over what is left."""
    order = row.argsort(descending=True).tolist()
    kept = order[:k] if k > 0 else order
    probs = torch.softmax(row[kept].double(), 0).tolist()
    kept = [token for token, prob in zip(kept, probs) if prob >= min_p * probs[0]]
    cumulative, chosen = 0.0, []
    for token, prob in zip(kept, torch.softmax(row[kept].double(), 0).tolist()):
        if cumulative >= p and chosen:
            break
        chosen.append(token)
        cumulative += prob
    keep = torch.zeros_like(row, dtype=torch.bool)
    keep[chosen] = True
    return keep


def test_penalties_follow_vllm_definitions():
    logits = torch.randn(2, 10)
    prompt_mask = torch.zeros(2, 10, dtype=torch.bool)
    prompt_mask[0, 1] = True
    counts = torch.zeros(2, 10)
    counts[0, 2] = 3
    counts[1, 4] = 1
    out = penalise(logits, prompt_mask, counts, torch.tensor([2.0, 1.0]), torch.tensor([0.5, 0.0]),
                          torch.tensor([0.0, 1.0]))
    rep = lambda x: x / 2 if x > 0 else x * 2  # noqa: E731
    assert torch.isclose(out[0, 1], torch.tensor(rep(logits[0, 1].item())))
    assert torch.isclose(out[0, 2], torch.tensor(rep(logits[0, 2].item()) - 1.5))
    assert torch.isclose(out[1, 4], logits[1, 4] - 1.0)
    untouched = [i for i in range(10) if i not in (1, 2)]
    assert torch.equal(out[0, untouched], logits[0, untouched])


def test_prompt_logprobs_match_transformers(checkpoint_factory):
    """Each prompt token's logprob under the model, as transformers computes it, also across chunks."""
    from tests.reference import load_reference

    path = checkpoint_factory("qwen3.5")
    prompt = [random.randrange(300) for _ in range(30)]
    llm = LLM(path, device="cpu", max_num_batched_tokens=11)  # the prompt spans three chunks
    out = llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=2))[0]
    reference = load_reference(path)
    with torch.no_grad():
        expected = torch.log_softmax(reference(torch.tensor([prompt])).logits[0].float(), -1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for position in range(1, len(prompt)):
        entry = out.prompt_logprobs[position]
        token = prompt[position]
        assert abs(entry[token].logprob - expected[position - 1, token].item()) < 1e-4
        # its rank among the reference's logprobs, where those within rounding of its own may stand either side
        row, own = expected[position - 1], expected[position - 1, token]
        assert int((row > own + 1e-4).sum()) + 1 <= entry[token].rank <= int((row > own - 1e-4).sum())
        assert len([t for t, e in entry.items() if e.rank <= 2]) >= 2


def test_cumulative_logprob_is_the_samples_logprob_under_transformers(checkpoint_factory):
    from tests.reference import load_reference

    path = checkpoint_factory("qwen3.5")
    prompt = [random.randrange(3, 300) for _ in range(random.randint(1, 20))]
    llm = LLM(path, device="cpu")
    params = SamplingParams(n=2, max_tokens=8, temperature=1.0, seed=random.randrange(2**31), ignore_eos=True,
                            logprobs=0)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    reference = load_reference(path)
    for sample in out.outputs:
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + sample.token_ids])).logits[0].float()
        expected = torch.log_softmax(logits[len(prompt) - 1:-1], -1)[range(8), sample.token_ids].sum().item()
        assert abs(sample.cumulative_logprob - expected) < 1e-3
    plain = llm.generate([prompt], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0]
    assert plain.cumulative_logprob is None  # as vLLM: no logprobs asked, none summed


def test_logit_bias_forces_and_bans_tokens_and_logprobs_stay_the_models(checkpoint_factory):
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(10)]
    plain = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].outputs[0]
    forced_id = rng.choice([t for t in range(300) if t != plain.token_ids[0]])
    for temperature in (0, 1.0):
        forced = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=temperature, ignore_eos=True,
                                                       logit_bias={forced_id: 100}, logprobs=0))[0].outputs[0]
        assert forced.token_ids == [forced_id] * 8
        # the model's own logprob of a token that is not its argmax (so at most log 0.5), not the biased
        # distribution's (about 0)
        assert forced.logprobs[0][forced_id].logprob <= math.log(0.5)
    banned = {t: -100 for t in plain.token_ids}
    other = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True,
                                                  logit_bias=banned))[0].outputs[0]
    assert not set(other.token_ids) & set(plain.token_ids)
    again = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].outputs[0]
    assert again.token_ids == plain.token_ids  # nothing of the biases stays behind


def test_greedy_under_biases_and_penalties_is_the_reference_argmax_in_vllms_order(checkpoint_factory):
    """transformers' logits, each row's logit_bias added and then the repetition, frequency and presence
    penalties applied (vLLM's sampler: biases and refusals before penalties), the argmax: a bias on a token the
    repetition penalty divides or multiplies gives another token in the other order."""
    from tests.reference import load_reference

    path = checkpoint_factory("llama")
    llm, reference = LLM(path, device="cpu"), load_reference(path)
    rng = random.Random()
    for _ in range(4):
        prompt = [rng.randrange(300) for _ in range(rng.randint(2, 12))]
        with torch.no_grad():
            first = reference(torch.tensor([prompt])).logits[0, -1].double()
        repetition = rng.choice([rng.uniform(1.5, 4.0), rng.uniform(0.3, 0.7)])
        # biases that bring prompt tokens level with the best token, where the penalty's order decides
        bias = {t: float(first.max() - first[t]) + rng.uniform(-1.0, 1.0) for t in rng.sample(prompt, 2)}
        bias[rng.randrange(300)] = rng.uniform(-3.0, 3.0)
        params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logit_bias=bias,
                                repetition_penalty=repetition, frequency_penalty=rng.uniform(0, 1),
                                presence_penalty=rng.uniform(0, 1))
        tokens = list(prompt)
        for _ in range(5):
            with torch.no_grad():
                logits = reference(torch.tensor([tokens])).logits[0, -1].double()
            for token, value in bias.items():
                logits[token] += value
            output = tokens[len(prompt):]
            for token in set(tokens):
                logits[token] = logits[token] / repetition if logits[token] > 0 else logits[token] * repetition
            for token in set(output):
                logits[token] -= params.frequency_penalty * output.count(token) + params.presence_penalty
            tokens.append(int(logits.argmax()))
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        assert out.token_ids == tokens[len(prompt):], (prompt, bias, repetition)


def test_bad_logit_bias_is_refused(checkpoint_factory):
    for bias in ({1: 1e39}, {1: "up"}, {"1": 2.0}, {1: float("nan")}, [1, 2]):
        with pytest.raises(InvalidSamplingParamsError, match="logit_bias"):
            SamplingParams(logit_bias=bias)
    # as vLLM's: any bias is taken; from_optional reads the keys as ids and clamps to OpenAI's [-100, 100]
    big = random.uniform(100.5, 1e6)
    assert SamplingParams(logit_bias={1: big}).logit_bias == {1: big}
    assert SamplingParams.from_optional(logit_bias={"1": big, 2: -big, "3": 7.5}).logit_bias == \
        {1: 100.0, 2: -100.0, 3: 7.5}
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(InvalidSamplingParamsError, match=f"token id {vocab} is outside the vocabulary"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=2, logit_bias={vocab: 1.0}))
    assert llm.generate([[1, 2]], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids


def test_a_biased_greedy_row_is_not_left_to_the_decode_graphs_argmax():
    def rows(*params, **fields):
        return [Request(f"r{i}", [1, 2], p, 16, **fields) for i, p in enumerate(params)]

    plain = SamplingParams(temperature=0)
    assert Sampler.greedy(rows(plain, plain))
    assert not Sampler.greedy(rows(plain, SamplingParams(temperature=0, logit_bias={3: -100})))
    assert not Sampler.greedy(rows(plain, SamplingParams(temperature=0, allowed_token_ids=[3, 4])))
    assert not Sampler.greedy(rows(plain, bad_words_ids=[[5, 6]]))
    # short of its min_tokens, a row refuses its stop tokens; past them it is plain again
    assert not Sampler.greedy(rows(SamplingParams(temperature=0, min_tokens=2), held_back=[0]))
    assert Sampler.greedy(rows(SamplingParams(temperature=0, min_tokens=2), held_back=[0], output_token_ids=[7, 8]))
    assert not Sampler.device_only(SamplingParams(bad_words=["no"]))  # its refusals follow the last tokens
    assert Sampler.device_only(SamplingParams(temperature=0, logit_bias={3: 5}))  # no past tokens needed


class _NoHostReads(TorchFunctionMode):
    """Fails on any read of a tensor's values into Python: on a GPU each one waits for the device."""

    READS = {"__bool__", "item", "tolist", "__int__", "__float__", "__index__", "nonzero"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            raise AssertionError(f"the sampler read a tensor back: {func.__name__}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("masked", [False, True])
def test_sampling_on_device_reads_nothing_back(masked):
    """A launched decode step samples without waiting for its logits (asynchronous scheduling), also
    where rows mask top-k / top-p / min-p or carry a logit bias; greedy and top-k 1 rows still take the
    argmax."""
    vocab = 64
    sampler = Sampler(vocab, torch.device("cpu"), seed=random.randrange(2**31))
    mask = dict(top_k=1) if masked else {}
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, **mask),
              SamplingParams(temperature=1.0, seed=random.randrange(1000), **mask),
              SamplingParams(temperature=0.7, top_p=0.5 if masked else 1.0, min_p=0.1 if masked else 0.0),
              SamplingParams(temperature=0.9, logit_bias={3: 100.0}), SamplingParams(temperature=0, min_tokens=5),
              SamplingParams(temperature=0.8, allowed_token_ids=[9])]
    logits = torch.randn(len(params), vocab)
    requests = [Request(f"r{i}", [1], p, 16, output_token_ids=[1, 2], held_back=[int(logits[i].argmax())] if i == 5
                        else []) for i, p in enumerate(params)]
    with _NoHostReads():
        tokens = sampler.sample_on_device(logits, requests)
    best = logits.argmax(-1)
    assert tokens[0] == best[0]
    if masked:
        assert torch.equal(tokens[1:3], best[1:3])
    assert tokens[4] == 3  # its bias outweighs every other logit
    assert tokens[5] == logits[5].topk(2).indices[1]  # its argmax is a stop token it may not take yet
    assert tokens[6] == 9
    assert all(0 <= t < vocab for t in tokens.tolist())


def test_penalties_of_many_rows_match_each_row_built_alone():
    """The rows' prompt and output tokens, sent together as flat entries, penalise each row as its own
    dense mask and counts do (repeated tokens, a row without output yet)."""
    vocab, rows = 40, 5
    sampler = Sampler(vocab, torch.device("cpu"), seed=0)
    requests = []
    for i in range(rows):
        params = SamplingParams(temperature=0.5, repetition_penalty=1 + random.random(),
                                frequency_penalty=random.random(), presence_penalty=random.random())
        outputs = [random.randrange(vocab) for _ in range(random.randrange(12) if i else 0)]
        requests.append(Request(f"r{i}", [random.randrange(vocab) for _ in range(9)], params, 20,
                                output_token_ids=outputs))
    logits = torch.randn(rows, vocab)
    expected = logits.clone()
    for i, r in enumerate(requests):
        mask = torch.zeros(1, vocab, dtype=torch.bool)
        mask[0, r.prompt_token_ids] = True
        counts = torch.bincount(torch.tensor(r.output_token_ids, dtype=torch.int64), minlength=vocab).float()[None]
        p = r.params
        expected[i] = penalise(logits[i : i + 1], mask, counts, torch.tensor([p.repetition_penalty]),
                               torch.tensor([p.frequency_penalty]), torch.tensor([p.presence_penalty]))[0]
    assert torch.equal(sampler._penalise(logits, requests), expected)
    for r in requests[:3]:  # later steps: the lists kept from the last step grow by the new tokens alone
        r.output_token_ids.append(r.prompt_token_ids[0])
    requests[1].add_pending_token()  # still on the device: not listed
    del requests[2].output_token_ids[:2]  # an output that shrank is listed again
    prompt, output = sampler.penalty_tokens(requests)
    for i, r in enumerate(requests):
        assert prompt.tokens[prompt.offsets[i] : prompt.offsets[i + 1]].tolist() == sorted(set(r.prompt_token_ids))
        assert output.tokens[output.offsets[i] : output.offsets[i + 1]].tolist() == r.resolved_output_ids
    assert prompt.longest == max(len(set(r.prompt_token_ids)) for r in requests)
    assert output.longest == max(len(r.resolved_output_ids) for r in requests)
    # each part of the one copy starts 16-byte aligned, whatever the row count: one kernel compile serves all
    assert all(t.data_ptr() % 16 == 0 for t in (prompt.offsets, output.offsets, output.tokens))


def _reference_greedy_holding_back(reference, prompt, stops, min_tokens, max_tokens, held=()):
    """transformers' greedy tokens where the stop tokens (and `held`) are refused before min_tokens and the stop
    tokens end the output after."""
    ids, out = list(prompt), []
    with torch.no_grad():
        while len(out) < max_tokens:
            logits = reference(torch.tensor([ids])).logits[0, -1].float()
            if len(out) < min_tokens:
                logits[[*stops, *held]] = float("-inf")
            token = int(logits.argmax())
            out.append(token)
            ids.append(token)
            if token in stops:
                return out, "stop"
    return out, "length"


@pytest.mark.parametrize("arch", ["qwen3.5", "llama"])
def test_min_tokens_refuses_the_stop_tokens_until_then(arch, checkpoint_factory):
    """The model's own first tokens made stop tokens: before min_tokens it takes its next best instead, after
    them a stop token ends the output, as transformers' argmax with the same rule gives."""
    from tests.reference import load_reference

    path = checkpoint_factory(arch)
    llm = LLM(path, device="cpu")
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(2, 20))]
    plain = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].outputs[0]
    stops = sorted(set(plain.token_ids[:2]))
    min_tokens = rng.randint(2, 8)
    params = SamplingParams(max_tokens=12, min_tokens=min_tokens, temperature=0, ignore_eos=True, stop_token_ids=stops)
    out = llm.generate([prompt], params)[0].outputs[0]
    # ignore_eos or not, min_tokens holds back the end of sequence too, as vLLM's min-tokens processor does
    eos = sorted(llm.engine.eos_token_ids)
    tokens, reason = _reference_greedy_holding_back(load_reference(path), prompt, stops, min_tokens, 12, eos)
    assert (out.token_ids, out.finish_reason) == (tokens, reason)
    assert not set(out.token_ids[:min_tokens]) & set(stops + eos)
    again = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                  stop_token_ids=stops))[0].outputs[0]
    assert again.token_ids == plain.token_ids[:1] and again.finish_reason == "stop"  # nothing stays behind


def test_min_tokens_holds_back_the_end_of_sequence_and_stop_strings(checkpoint_factory, demo_llm):
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    eos = min(llm.engine.eos_token_ids)
    prompt = [random.randrange(300) for _ in range(8)]
    min_tokens = random.randint(1, 10)
    for temperature in (0, 1.0):  # the end of sequence outweighs every other token: it comes just at min_tokens
        out = llm.generate([prompt], SamplingParams(max_tokens=16, min_tokens=min_tokens, temperature=temperature,
                                                    logit_bias={eos: 100}))[0].outputs[0]
        assert len(out.token_ids) == min_tokens + 1 and out.token_ids[-1] == eos and out.finish_reason == "stop"
        assert eos not in out.token_ids[:-1]
    # under ignore_eos the end of sequence stops nothing, but min_tokens still holds it back (vLLM's rule)
    out = llm.generate([prompt], SamplingParams(max_tokens=min_tokens + 3, min_tokens=min_tokens, ignore_eos=True,
                                                temperature=0, logit_bias={eos: 100}))[0].outputs[0]
    assert eos not in out.token_ids[:min_tokens] and out.token_ids[min_tokens:] == [eos] * 3
    assert out.finish_reason == "length"
    # A stop string found before min_tokens does not count; one in the text after does.
    params = dict(max_tokens=40, temperature=0, stop=[","])
    early = demo_llm.generate(["Count with me: 1, 2, 3, 4, 5"], SamplingParams(**params))[0].outputs[0]
    later = demo_llm.generate(["Count with me: 1, 2, 3, 4, 5"], SamplingParams(min_tokens=6, **params))[0].outputs[0]
    assert early.stop_reason == "," and len(early.token_ids) < 6
    assert later.stop_reason == "," and len(later.token_ids) > 6 and later.text.count(",") >= 2


def test_min_tokens_past_max_tokens_is_refused():
    for fields in ({"min_tokens": -1}, {"min_tokens": 5, "max_tokens": 4}, {"min_tokens": 1.5}):
        with pytest.raises(InvalidSamplingParamsError, match="min_tokens"):
            SamplingParams(**fields)
    assert SamplingParams(min_tokens=4, max_tokens=4).min_tokens == 4


@pytest.mark.parametrize("arch", ["qwen3.5", "llama"])
def test_allowed_token_ids_keep_the_output_to_them(arch, checkpoint_factory):
    """Greedy: transformers' argmax over the allowed tokens; sampled: never a token outside them."""
    from tests.reference import load_reference

    path = checkpoint_factory(arch)
    llm = LLM(path, device="cpu")
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(2, 20))]
    allowed = rng.sample(range(300), rng.randint(1, 12))
    out = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True,
                                                allowed_token_ids=allowed))[0].outputs[0]
    reference, ids, expected = load_reference(path), list(prompt), []
    with torch.no_grad():
        for _ in range(10):
            logits = reference(torch.tensor([ids])).logits[0, -1].float()
            token = allowed[int(logits[allowed].argmax())]
            expected.append(token)
            ids.append(token)
    assert out.token_ids == expected
    sampled = llm.generate([prompt] * 2, [SamplingParams(n=3, max_tokens=10, temperature=1.5, ignore_eos=True,
                                                         seed=rng.randrange(1000), allowed_token_ids=allowed),
                                          SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)])
    assert all(set(o.token_ids) <= set(allowed) for o in sampled[0].outputs)
    assert sampled[1].outputs[0].token_ids == llm.generate([prompt], SamplingParams(
        max_tokens=10, temperature=0, ignore_eos=True))[0].outputs[0].token_ids  # the free row beside them
    vocab = llm.engine.model_config.vocab_size
    for bad in ([], [vocab], [1.5]):
        with pytest.raises(InvalidSamplingParamsError, match="allowed_token_ids"):
            llm.generate([prompt], SamplingParams(max_tokens=2, allowed_token_ids=bad))


def _run_together(engine, requests: dict) -> dict:
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step(final_only=True):
            finished[output.request_id] = output
    return finished


@pytest.mark.parametrize("arch", ["qwen3.5", "llama"])
def test_constraints_that_refuse_every_token_end_that_request_alone(arch, checkpoint_factory):
    """allowed_token_ids all among the stop tokens that min_tokens holds back leave nothing to come first: the
    request ends there with an error naming both, having written no token they refuse (a row of -inf had
    sampled token 0), and a request in the same steps gives what it gives alone."""
    llm = LLM(checkpoint_factory(arch), device="cpu")
    rng = random.Random()
    prompt = lambda: [rng.randrange(300) for _ in range(rng.randint(2, 20))]  # noqa: E731
    stops = rng.sample(range(300), rng.randint(1, 4))
    n = rng.randint(1, 3)
    stuck = SamplingParams(max_tokens=8, min_tokens=rng.randint(1, 4), stop_token_ids=stops, n=n,
                           allowed_token_ids=rng.sample(stops, rng.randint(1, len(stops))),
                           temperature=rng.choice([0.0, 1.0]) if n == 1 else 1.0)
    free_prompt, free = prompt(), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    alone = llm.generate([free_prompt], free)[0].outputs[0].token_ids
    finished = _run_together(llm.engine, {"stuck": (prompt(), stuck), "free": (free_prompt, free)})
    error = finished["stuck"].error
    assert isinstance(error, NoTokenAllowedError) and error.fields == ["allowed_token_ids", "min_tokens"], error
    assert "output token 0" in str(error)
    assert [(o.finish_reason, o.token_ids) for o in finished["stuck"].outputs] == [("abort", [])] * n
    assert finished["free"].outputs[0].token_ids == alone and finished["free"].error is None
    with pytest.raises(NoTokenAllowedError, match="allowed_token_ids and min_tokens together refuse"):
        llm.generate([prompt()], stuck)
    # one allowed token that nothing refuses is enough (not a stop token, nor the end of sequence, which min_tokens
    # holds back too): the output is that token until it may stop
    other = rng.choice([t for t in range(300) if t not in stops and t not in llm.engine.eos_token_ids])
    out = llm.generate([prompt()], SamplingParams(max_tokens=8, min_tokens=stuck.min_tokens, stop_token_ids=stops,
                                                  allowed_token_ids=stuck.allowed_token_ids + [other],
                                                  temperature=0))[0].outputs[0]
    assert out.token_ids[: stuck.min_tokens] == [other] * stuck.min_tokens and out.finish_reason in ("stop", "length")


def test_a_dead_end_names_the_constraints_that_meet_there():
    """Which constraints refuse every token, read from the request as the sampler leaves it."""
    word = [random.randrange(100, 200) for _ in range(random.randint(1, 3))]
    params = SamplingParams(allowed_token_ids=[word[-1]], stop_token_ids=[7], min_tokens=2)
    request = Request("r", [1, 2], params, 16, output_token_ids=word[:-1], held_back=[7], bad_words_ids=[word])
    refused = request.refused_tokens()
    assert request.allows_no_token(refused) and set(refused) == {word[-1]} | ({7} if len(word) < 3 else set())
    request.mark_dead_end()
    index, error = request.dead_end
    assert index == len(word) - 1 and f"output token {index}" in str(error)
    assert error.fields == ["allowed_token_ids"] + (["min_tokens"] if len(word) < 3 else []) + ["bad_words"]
    request.output_token_ids.append(250)  # a longer word no longer ends the output: its last token may come
    assert request.allows_no_token(request.refused_tokens()) == (len(word) == 1)
    request.mark_dead_end()
    assert request.dead_end == (index, error)  # the first dead end stays


def _bad_words_ids(tok, word: str) -> list[list[int]]:
    """vLLM's reading of a bad word: its tokens bare, and after a space where that has as many, another first."""
    bare, spaced = tok.encode(word, add_special_tokens=False), tok.encode(" " + word, add_special_tokens=False)
    return [bare] + ([spaced] if len(spaced) == len(bare) and spaced[0] != bare[0] else [])


def _holds(tokens: list[int], word: list[int]) -> bool:
    return any(tokens[i : i + len(word)] == word for i in range(len(tokens) - len(word) + 1))


def test_bad_words_are_never_written(demo_llm, demo_reference):
    """Words of the demo model's own greedy answer made bad: its tokens are transformers' argmax where the last
    token of each bad word (bare, and after a space) is refused wherever the output ends with its others."""
    tok = demo_llm.get_tokenizer()
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three fruits and a colour."}]),
                        add_special_tokens=False)
    free = demo_llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0))[0].outputs[0]
    written = [w for w in sorted(set(re.findall(r"[A-Za-z]{3,}", free.text)))
               if any(_holds(free.token_ids, ids) for ids in _bad_words_ids(tok, w))]
    words = random.sample(written, 2)
    out = demo_llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0, bad_words=words))[0].outputs[0]
    bad = [ids for w in words for ids in _bad_words_ids(tok, w)]
    ids, expected = list(prompt), []
    with torch.no_grad():
        while len(expected) < 24:
            logits = demo_reference(torch.tensor([ids])).logits[0, -1].float()
            for b in bad:
                if len(b) == 1 or (len(expected) >= len(b) - 1 and expected[len(expected) - len(b) + 1:] == b[:-1]):
                    logits[b[-1]] = float("-inf")
            token = int(logits.argmax())
            expected.append(token)
            ids.append(token)
            if token in demo_llm.engine.eos_token_ids:
                break
    assert out.token_ids == expected, (words, free.text, out.text)
    assert not any(_holds(out.token_ids, b) for b in bad) and out.token_ids != free.token_ids
    with pytest.raises(InvalidSamplingParamsError, match="bad_words"):
        SamplingParams(bad_words=["ok", " "])


def test_include_stop_str_in_output_keeps_a_stop_tokens_text(demo_llm):
    """vLLM's include_stop_str_in_output keeps the text of the token that stopped the output (a stop token id,
    as a stop string's), and leaves it out otherwise."""
    prompt = random.choice(["The capital of France is", "Once upon a time", "1, 2, 3,"])
    free = demo_llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].outputs[0]
    ids = free.token_ids
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # the first token not seen before it
    tokenizer = demo_llm.engine.tokenizer
    for include in (True, False):
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[ids[k]],
                                include_stop_str_in_output=include)
        out = demo_llm.generate([prompt], params)[0].outputs[0]
        assert (out.token_ids, out.finish_reason, out.stop_reason) == (ids[: k + 1], "stop", ids[k])
        assert out.text == tokenizer.decode(ids[: k + 1 if include else k])
    # a stop string that the kept text of the stop token completes is the reason, as vLLM's detokenizer finds it
    text = tokenizer.decode(ids[: k + 1])
    stop = text[len(tokenizer.decode(ids[:k])) - 1:]  # the token's text and the character before it
    if stop and text.find(stop) == len(text) - len(stop):
        for include in (True, False):
            params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[ids[k]],
                                    stop=[stop], include_stop_str_in_output=include)
            out = demo_llm.generate([prompt], params)[0].outputs[0]
            assert (out.token_ids, out.stop_reason) == (ids[: k + 1], stop if include else ids[k]), (text, stop)


def test_the_end_of_sequence_gives_vllms_stop_reasons(tmp_path):
    """vLLM's check_stop: the tokenizer's end of sequence stops with no reason, ahead of stop_token_ids; the
    checkpoint's other ends of sequence stop as stop tokens do, naming themselves; ignore_eos stops neither."""
    llm = LLM(make_checkpoint("llama", str(tmp_path), eos_token_id=[2, 0]), device="cpu")
    primary = llm.engine.tokenizer.hf.eos_token_id
    other = next(iter(llm.engine.eos_token_ids - {primary}))
    prompt = [random.randrange(3, 300) for _ in range(6)]

    def forced(token: int, **fields):
        params = SamplingParams(max_tokens=3, temperature=0, logit_bias={token: 100}, **fields)
        out = llm.generate([prompt], params)[0].outputs[0]
        return out.token_ids, out.finish_reason, out.stop_reason

    assert forced(primary) == ([primary], "stop", None)
    assert forced(other) == ([other], "stop", other)
    assert forced(primary, stop_token_ids=[primary]) == ([primary], "stop", None)
    assert forced(primary, stop_token_ids=[primary], ignore_eos=True) == ([primary], "stop", primary)
    assert forced(other, ignore_eos=True) == ([other] * 3, "length", None)


def test_top_k_zero_is_off_as_in_vllm(checkpoint_factory):
    """vLLM's default top_k is 0, "consider all tokens": seeded draws are those of top_k=-1."""
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    prompt = [random.randrange(300) for _ in range(10)]
    seed = random.randrange(2**31)
    draws = [llm.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0, seed=seed, ignore_eos=True,
                                                   top_k=k))[0].outputs[0].token_ids for k in (0, -1)]
    assert draws[0] == draws[1]
