"""Randomized differential test: what a request gets must not depend on what runs beside it.

Each trial draws an engine (block size, step budget, a KV pool near its minimum so that requests are
preempted and recomputed, prefix caching with few snapshot slots, asynchronous scheduling or not) and a mix
of requests: prompts cut from shared prefixes at block boundaries and one token either side, follow-ups
built from earlier replies (whole, partial, or all but the last token), greedy and seeded sampled rows,
n > 1, stop strings and stop tokens, min_tokens, allowed tokens, bad words, logprobs, grammars, cache salts,
and aborts mid-way. Every request that finishes must give the tokens, finish reason and text it gives alone on an engine
without prefix caching, its logprobs within rounding (a request that fails ends all its samples at once, so
there the shorter run of each sample is a prefix of the longer); at the end no block, state slot or snapshot
may be held. Rounding of other batch shapes may tip a draw whose best two tokens all but tie: a sample may
part from its lone run only at such a tie, which the lone run's processed logits and seeded noise show. The same
mixes, greedy, on an engine that drafts (with the MTP head, or by prompt lookup) must give what plain greedy
decoding gives alone. The seed of a failing trial is in the assertion's message."""

from __future__ import annotations

import dataclasses
import random
import shutil

import pytest
import torch

from deltaserve import SamplingParams, StructuredOutputsParams
from deltaserve.engine.llm_engine import LLMEngine
from deltaserve.kernels.sampling.reference import uniforms
from deltaserve.runner.sampler import row_seed
from tests.checkpoints import add_mtp_weights, every_expert
from tests.uncaptured_graphs import with_uncaptured_graphs

MAX_MODEL_LEN = 320
VOCAB = 300
STOP_STRINGS = ["e", "th", " a", "o", "!"]
BAD_WORDS = ["the", "e", "an", "of"]
TRIALS = 5
SPECULATIVE_TRIALS = 5
LOGPROB_TOLERANCE = 5e-4  # a wrong row or state moves a logprob by far more
STRUCTURES = [StructuredOutputsParams(regex="[a-z]{1,6}( [0-9]{1,3}){1,5}"),
              StructuredOutputsParams(choice=["the fox", "the dog", "Paris"]),
              StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
              StructuredOutputsParams(grammar='root ::= word (" " word)*\nword ::= [a-z]+')]


def _params(rng: random.Random, greedy: bool = False) -> SamplingParams:
    kw: dict = {"max_tokens": rng.randint(1, 24), "ignore_eos": rng.random() < 0.7}
    if greedy or rng.random() < 0.5:
        kw["temperature"] = 0.0
    else:
        kw.update(temperature=rng.choice([0.7, 1.0]), seed=rng.randrange(2**31))
        if rng.random() < 0.4:
            kw["top_k"] = rng.choice([1, 5, 40])
        if rng.random() < 0.4:
            kw["top_p"] = 0.9
        kw["n"] = rng.choice([1, 1, 2, 3])
    if rng.random() < 0.4:
        kw["logprobs"] = rng.choice([0, 2])
    if rng.random() < 0.15:
        kw["repetition_penalty"] = 1.3
    if rng.random() < 0.2:
        kw["stop_token_ids"] = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.2:
        kw["stop"] = rng.sample(STOP_STRINGS, rng.randint(1, 2))
    if rng.random() < 0.15:
        kw["structured_outputs"] = rng.choice(STRUCTURES)
    if rng.random() < 0.2:
        kw["min_tokens"] = rng.randint(0, kw["max_tokens"])
    if rng.random() < 0.1 and "structured_outputs" not in kw:  # beside a grammar it could leave no token
        kw["allowed_token_ids"] = rng.sample(range(3, VOCAB), rng.randint(1, 40))
    if rng.random() < 0.1:
        kw["bad_words"] = rng.sample(BAD_WORDS, rng.randint(1, 2))
    return SamplingParams(**kw)


def _summary(output) -> list[tuple]:
    """Per sample: tokens, finish reason, text, the chosen tokens' logprobs (or None), and the request's error
    (or None)."""
    samples = []
    for o in sorted(output.outputs, key=lambda o: o.index):
        logprobs = None if o.logprobs is None else [e[t].logprob for e, t in zip(o.logprobs, o.token_ids)]
        samples.append((list(o.token_ids), o.finish_reason, o.text, logprobs, _error(output)))
    return samples


def _error(output) -> str | None:
    # its kind only: the fields it names are those of the sample that met its dead end first
    return None if output.error is None else type(output.error).__name__


def _first_difference(got: list[int], want: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)


def _assert_same_sample(got: tuple, want: tuple, where: str) -> None:
    """A request that fails (its constraints refuse every token somewhere) ends all its samples when the first
    one meets that point: how far the others got then, and whether they had finished on their own, depends on
    what ran beside them. Each sample's tokens are still its own: the shorter run of a sample is a prefix of
    the longer, and one that was not cut short is the same in both."""
    assert got[4] == want[4], where
    if want[4] is None:
        assert got[:3] == want[:3], where
    else:
        shorter, longer = sorted([got, want], key=lambda sample: len(sample[0]))
        assert longer[0][:len(shorter[0])] == shorter[0], where
        assert shorter[1] == "abort" or shorter[:3] == longer[:3], where
    if want[3] is not None:  # fp32 rounding of other batch shapes moves them up to about 6e-5
        assert max((abs(a - b) for a, b in zip(got[3], want[3])), default=0) < LOGPROB_TOLERANCE, where


def _alone_engine(path: str, **options) -> LLMEngine:
    return LLMEngine.from_args(path, device="cpu", enable_prefix_caching=False, max_num_seqs=4,
                               max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=2048, **options)


def _finish(engine: LLMEngine, prompt: list[int], params: SamplingParams):
    engine.add_request("alone", list(prompt), params)
    done = None
    while done is None:
        done = next((o for o in engine.step() if o.finished), None)
    return done


class Alone:
    """Each request run by itself, without prefix caching: what it must give in any mix."""

    def __init__(self, path: str):
        self.path = path
        self.engine = _alone_engine(path)
        self.drawn_from = None  # the same engine reporting the logits each token is drawn from, made when needed
        self.known: dict = {}

    def run(self, prompt: list[int], params: SamplingParams) -> list[tuple]:
        key = (tuple(prompt), repr(params))
        if key not in self.known:
            self.known[key] = _summary(_finish(self.engine, prompt, params))
        return self.known[key]

    def tie_margin(self, prompt: list[int], params: SamplingParams, index: int, position: int, got: int,
                   where: str) -> float:
        """How far the lone run's token at `position` of sample `index` scored above `got` in its draw: the
        lone run again (its batch shapes, so its logits to the bit) with every token's processed logits, plus
        the seeded noise that the sampler adds at that position."""
        if self.drawn_from is None:
            self.drawn_from = _alone_engine(self.path, max_logprobs=-1, logprobs_mode="processed_logits")
        again = _finish(self.drawn_from, prompt, dataclasses.replace(params, logprobs=-1))
        sample = next(o for o in again.outputs if o.index == index)
        want = self.run(prompt, params)[index][0]
        assert list(sample.token_ids[: position + 1]) == want[: position + 1], f"{where}: the lone run did not repeat"
        entry = sample.logprobs[position]
        scores = torch.tensor([entry[t].logprob for t in range(len(entry))])
        if params.temperature > 0:
            seed = row_seed(params.seed + index, 0, position)
            scores += -torch.log(-torch.log(uniforms(torch.tensor([seed]), len(entry))[0]))
        assert scores.argmax().item() == want[position], f"{where}: the noise did not replay the lone run's draw"
        return (scores[want[position]] - scores[got]).item()


class Mix:
    def __init__(self, path: str, rng: random.Random, speculative_config: dict | None = None):
        """speculative_config: the engine drafts so, and every request is greedy (a sampled one's draws would be
        speculative sampling's, not a plain run's); in half the mixes its steps run in the graphs' layouts
        (uncaptured, so eagerly): the verify graphs', and prompt lookup's decode and prefill graphs'."""
        self.rng = rng
        self.greedy = speculative_config is not None
        drafting = {"speculative_config": speculative_config} if speculative_config else {}
        self.block = rng.choice([8, 16, 32])
        fewest = -(-MAX_MODEL_LEN // self.block)  # one longest sequence's blocks
        budget = rng.choice([rng.randint(1, 16), rng.randint(16, 128), 2048])
        # Under a budget of a few tokens a step is a few rows: prompts of up to 250 tokens, recomputed after
        # preemptions, made mixes of 15k steps and more. Shorter ones meet the same chunk edges in fewer steps.
        self.longest = 250 if budget > 16 else 48
        self.engine = LLMEngine.from_args(
            path, device="cpu", max_model_len=MAX_MODEL_LEN, block_size=self.block,
            max_num_seqs=rng.choice([1, 2, 4, 6]),
            max_num_batched_tokens=budget,
            num_kv_blocks=rng.randint(fewest, fewest + fewest // 2), enable_prefix_caching=rng.random() < 0.85,
            ssm_snapshot_slots=rng.choice([None, 0, 1, 4]), ssm_snapshot_interval=rng.choice([1024, self.block]),
            decode_snapshot_interval=rng.choice([256, self.block]), async_scheduling=rng.random() < 0.7,
            seed=rng.randrange(1000), **drafting)
        if speculative_config and rng.random() < 0.5:  # steps in the graphs' padded layouts
            with_uncaptured_graphs(self.engine)
        self.prefixes = [self._tokens(rng.randint(1, self.longest)) for _ in range(2)]
        self.sent: dict[str, tuple] = {}  # request id -> (prompt, params)
        self.finished: dict = {}
        self.aborted: set[str] = set()

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(3, VOCAB) for _ in range(n)]

    def _prompt(self) -> list[int]:
        rng, base = self.rng, self.rng.choice(self.prefixes)
        kind = rng.random()
        if kind < 0.3:
            return self._tokens(rng.randint(1, self.longest))
        if kind < 0.7:  # at a block boundary of a shared prefix, or a token either side of it
            cut = rng.randint(0, len(base) // self.block) * self.block + rng.choice([-1, 0, 1])
            return base[: max(1, min(cut, len(base)))]
        return base + self._tokens(rng.randint(0, 30))

    def _follow_up(self, request_id: str, output) -> list[int] | None:
        rng = self.rng
        if len(self.sent) > 16 or rng.random() > 0.4:
            return None
        reply = list(rng.choice(output.outputs).token_ids)
        cut = rng.choice([reply, reply[:-1], reply[: rng.randint(0, len(reply))]])
        prompt = self.sent[request_id][0] + cut + self._tokens(rng.choice([0, 1, rng.randint(1, 20)]))
        return prompt[-(MAX_MODEL_LEN - 40):]

    def run(self) -> None:
        rng, engine = self.rng, self.engine
        arrivals = [(rng.choice([0, 0, rng.randint(0, 20)]), self._prompt()) for _ in range(rng.randint(2, 7))]
        abort_at: dict[str, int] = {}
        step = idle = 0  # idle: steps since one gave an output (a step budget of one token makes long mixes)
        while arrivals or engine.has_unfinished_requests():
            for item in [a for a in arrivals if a[0] <= step]:
                arrivals.remove(item)
                request_id = f"r{len(self.sent)}"
                self.sent[request_id] = (item[1], _params(rng, self.greedy))
                # a cache salt keeps a request to the cache entries of its salt: what it gives never changes
                engine.add_request(request_id, *self.sent[request_id], cache_salt=rng.choice([None, None, "a", "b"]))
                if rng.random() < 0.12:
                    abort_at[request_id] = step + rng.randint(0, 12)
            for request_id in [r for r, at in abort_at.items() if at <= step]:
                del abort_at[request_id]
                if request_id not in self.finished:
                    engine.abort(request_id)
                    self.aborted.add(request_id)
            outputs = engine.step() if engine.has_unfinished_requests() else []
            idle = 0 if outputs else idle + 1
            for output in outputs:
                if output.finished:
                    self.finished[output.request_id] = output
                    follow_up = self._follow_up(output.request_id, output)
                    if follow_up:
                        arrivals.append((step + rng.choice([0, 1, 3]), follow_up))
            step += 1
            assert idle < 5000, "the mix made no progress"

    def assert_nothing_held(self) -> None:
        stats, blocks = self.engine.stats(), self.engine.scheduler.blocks
        assert (stats.kv_blocks_used, stats.state_slots_used, stats.num_running, stats.num_waiting) == (0, 0, 0, 0)
        assert not any(blocks.ref_counts)
        snapshots = self.engine.loaded.snapshots
        if snapshots is not None:
            assert snapshots.index.num_referenced == 0
        self.engine.reset_prefix_cache()
        assert blocks.num_free == blocks.num_blocks and blocks.num_cached == 0


@pytest.fixture(scope="module")
def alone_engines():
    return {}  # arch -> Alone, shared by the module's tests


@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3.5-moe", "qwen3-next", "llama"])
def test_a_request_gets_in_any_mix_what_it_gets_alone(arch, checkpoint_factory, alone_engines):
    path = checkpoint_factory(arch, **every_expert(arch))  # a mix and a lone run agree to rounding only
    alone = alone_engines.setdefault(arch, Alone(path))
    for _ in range(TRIALS):
        seed = random.randrange(2**32)
        mix = Mix(path, random.Random(seed))
        mix.run()
        mix.assert_nothing_held()
        _assert_alone(mix, alone, seed)


@pytest.mark.parametrize("arch, method", [("qwen3.5", "mtp"), ("qwen3-next", "mtp"), ("llama", "ngram"),
                                          ("qwen3.5", "ngram")])
def test_a_drafting_engine_gives_in_any_mix_what_plain_decoding_gives_alone(arch, method, checkpoint_factory,
                                                                             alone_engines, tmp_path):
    """The same mixes, greedy, on an engine that drafts 1 to 3 tokens a step with the checkpoint's MTP head or by
    prompt lookup (penalties, grammars, refusals, stops, logprobs, preemption, prefix caching, follow-ups and
    aborts among them): each request gives what plain greedy decoding gives it alone, to rounding ties as above."""
    path = checkpoint_factory(arch, **every_expert(arch))
    alone = alone_engines.setdefault(arch, Alone(path))
    drafting = path
    if method == "mtp":
        drafting = str(tmp_path / "with_head")
        shutil.copytree(path, drafting)
        add_mtp_weights(drafting, seed=1)
    drafted = 0
    for _ in range(SPECULATIVE_TRIALS):
        seed = random.randrange(2**32)
        config = {"method": method, "num_speculative_tokens": random.Random(seed).randint(1, 3)}
        if method == "ngram":
            config["prompt_lookup_min"] = 1  # random text repeats few longer n-grams
        mix = Mix(drafting, random.Random(seed), config)
        mix.run()
        mix.assert_nothing_held()
        _assert_alone(mix, alone, seed)
        drafted += mix.engine.stats().spec_decode_num_drafts  # none where a step's budget holds no verify chunk
    assert drafted > 0


def _assert_alone(mix: Mix, alone: Alone, seed: int) -> None:
    """Every request of the mix that finished gives what it gives alone, to rounding ties."""
    for request_id, output in mix.finished.items():
        if request_id in mix.aborted:
            continue
        prompt, params = mix.sent[request_id]
        for index, (got, want) in enumerate(zip(_summary(output), alone.run(prompt, params), strict=True)):
            where = f"trial seed {seed}, {request_id} ({len(prompt)} prompt tokens, {params})"
            at = _first_difference(got[0], want[0])
            # rounding moves a logit by under the tolerance (a logprob's, either way): so much for the two
            # tokens' difference, scaled as the penalty and temperature scale the logits
            tie = 2 * LOGPROB_TOLERANCE * params.repetition_penalty / (params.temperature or 1)
            if at is not None and alone.tie_margin(prompt, params, index, at, got[0][at], where) < tie:
                got, want = (_cut(sample, at) for sample in (got, want))
                assert got[0] == want[0], where
                if want[3] is not None:
                    assert max((abs(a - b) for a, b in zip(got[3], want[3])), default=0) < LOGPROB_TOLERANCE, where
                continue
            _assert_same_sample(got, want, where)


def _cut(sample: tuple, at: int) -> tuple:
    """A sample's tokens and logprobs before position `at`."""
    tokens, _, _, logprobs, _ = sample
    return tokens[:at], None, None, None if logprobs is None else logprobs[:at], None
