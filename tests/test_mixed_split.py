"""A step of decode rows and one short prefill chunk runs as two graphs, the decode rows' and the chunk's,
over the same StepBuffers (run eagerly on CPU in their padded layouts): a request arriving while others
decode, fresh or a prefix-cache hit restored inside its graph, gives what plain eager steps give, and so
do the rows decoding beside it."""

import random

import torch

from deltaserve import SamplingParams
from deltaserve.engine.llm_engine import LLMEngine
from deltaserve.runner.cuda_graphs import DecodeGraphs
from deltaserve.runner.model_runner import MANY_DECODE_ROWS, MIXED_SPLIT_MAX_ROWS, MIXED_SPLIT_MAX_ROWS_BESIDE_MANY
from deltaserve.runner.prefill_graphs import PrefillGraphs
from deltaserve.runner.step_buffers import StepBuffers


def _with_uncaptured_graphs(engine: LLMEngine, max_prefill_rows: int) -> list[tuple[int, int, bool]]:
    """Gives the engine decode and prefill graphs over one StepBuffers, never captured (each runs its padded
    batch eagerly); returns a list that records (decode rows, prefill rows, whether it restored a snapshot)
    of every step split into the two."""
    loaded, config = engine.loaded, engine.config
    runner = loaded.runner
    buffers = StepBuffers(config.max_num_seqs, -(-loaded.max_model_len // config.block_size), runner.kv_pool,
                          runner.state_pool, runner.device, max_prefill_rows=max_prefill_rows)
    runner.graphs = DecodeGraphs(runner.model, buffers, config.max_num_seqs, loaded.model_config.vocab_size)
    runner.prefill_graphs = PrefillGraphs(runner.model, buffers, runner.snapshots)
    splits, execute_graphs = [], runner._execute_graphs

    def recorded(plan, decode, prefill, captures):
        if decode is not None:
            splits.append((len(decode.chunks), prefill.chunks[0].num_tokens, bool(prefill.restores)))
        return execute_graphs(plan, decode, prefill, captures)

    runner._execute_graphs = recorded
    return splits


def _steps_until_finished(engine: LLMEngine, request_id: str, done: dict) -> None:
    while request_id not in done:
        _step(engine, done)


def _step(engine: LLMEngine, done: dict) -> None:
    for out in engine.step():
        if out.finished:
            o = out.outputs[0]
            logprobs = [entry[t].logprob for entry, t in zip(o.logprobs or [], o.token_ids)]
            done[out.request_id] = (o.token_ids, logprobs, out.num_cached_tokens)


def _arrivals(engine: LLMEngine, seed: int) -> dict:
    """A first turn run alone; two requests decoding, joined by a fresh prompt and then by the first turn's
    follow-up (a prefix-cache hit), each arriving alone while the others decode."""
    rng = random.Random(seed)
    params = lambda n: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=0)  # noqa: E731
    prompt = lambda low, high: [rng.randrange(300) for _ in range(rng.randint(low, high))]  # noqa: E731
    done = {}
    history = prompt(40, 90)
    engine.add_request("first", history, params(6))
    _steps_until_finished(engine, "first", done)
    for name in ("a", "b"):
        engine.add_request(name, prompt(3, 12), params(40))
    for _ in range(3):
        _step(engine, done)
    engine.add_request("fresh", prompt(20, 100), params(5))
    for _ in range(3):
        _step(engine, done)
    follow_up = history + done["first"][0] + prompt(20, 50)  # a tail over a block boundary: a mid-chunk capture
    engine.add_request("follow-up", follow_up, params(5))
    while engine.has_unfinished_requests():
        _step(engine, done)
    return done


def test_a_request_arriving_while_others_decode_runs_as_two_graphs_and_gives_the_eager_outputs(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    seed = random.randrange(10**6)
    outputs = []
    for split in (False, True):
        engine = LLMEngine.from_args(path, device="cpu", max_model_len=256, max_num_seqs=4,
                                     max_num_batched_tokens=256)
        splits = _with_uncaptured_graphs(engine, 128) if split else None
        outputs.append(_arrivals(engine, seed))
    # the fresh prompt's passes (a miss computes its last block's rows in a pass of their own, the pass a hit
    # replays) and the follow-up's tail each ran beside the decoding requests
    assert {restored for _, _, restored in splits} == {False, True} and all(rows >= 2 for rows, _, _ in splits)
    assert outputs[1]["follow-up"][2] > 0  # a prefix-cache hit
    for name, (tokens, logprobs, cached) in outputs[0].items():
        split_tokens, split_logprobs, split_cached = outputs[1][name]
        assert split_tokens == tokens and split_cached == cached
        torch.testing.assert_close(torch.tensor(split_logprobs), torch.tensor(logprobs), rtol=0, atol=1e-4)


def test_a_chunk_past_the_split_rows_or_beside_another_keeps_the_step_eager(checkpoint_factory):
    path = checkpoint_factory("qwen3.5", max_position_embeddings=2048)  # a context of max_model_len
    engine = LLMEngine.from_args(path, device="cpu", max_model_len=2048, max_num_seqs=8,
                                 max_num_batched_tokens=2048, enable_prefix_caching=False)
    splits = _with_uncaptured_graphs(engine, 2048)
    rng = random.Random()
    prompt = lambda n: [rng.randrange(300) for _ in range(n)]  # noqa: E731
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    done = {}
    engine.add_request("decoding", prompt(5), params)
    _step(engine, done)
    engine.add_request("long", prompt(MIXED_SPLIT_MAX_ROWS + 1), params)
    _step(engine, done)
    for name in ("x", "y"):  # two prompts in one step
        engine.add_request(name, prompt(rng.randint(2, 40)), params)
    _step(engine, done)
    assert splits == []
    short = prompt(rng.randint(2, MIXED_SPLIT_MAX_ROWS))
    engine.add_request("short", short, params)
    _step(engine, done)
    assert [(rows, n) for rows, n, _ in splits] == [(4, len(short))]  # beside "decoding", "long", "x" and "y"


def test_beside_many_decode_rows_a_longer_chunk_splits_and_gives_the_eager_outputs(checkpoint_factory):
    path = checkpoint_factory("qwen3.5", max_position_embeddings=2048)  # a context of max_model_len
    rng = random.Random()
    decoding = [[rng.randrange(300) for _ in range(rng.randint(2, 6))] for _ in range(MANY_DECODE_ROWS)]
    length = rng.randint(MIXED_SPLIT_MAX_ROWS + 1, MIXED_SPLIT_MAX_ROWS_BESIDE_MANY)  # eager beside fewer rows
    longer = [rng.randrange(300) for _ in range(length)]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=0)
    outputs, recorded = [], None
    for split in (False, True):
        engine = LLMEngine.from_args(path, device="cpu", max_model_len=2048, max_num_seqs=MANY_DECODE_ROWS + 1,
                                     max_num_batched_tokens=2048, enable_prefix_caching=False)
        splits = _with_uncaptured_graphs(engine, MIXED_SPLIT_MAX_ROWS_BESIDE_MANY) if split else []
        done = {}
        for i, prompt in enumerate(decoding):
            engine.add_request(f"d{i}", prompt, params)
        _step(engine, done)  # their prompts; then one decode step, and the longer prompt arrives
        _step(engine, done)
        engine.add_request("longer", longer, params)
        while engine.has_unfinished_requests():
            _step(engine, done)
        outputs.append(done)
        recorded = splits
    assert [(rows, n) for rows, n, _ in recorded] == [(MANY_DECODE_ROWS, len(longer))]
    for name, (tokens, logprobs, _) in outputs[0].items():
        torch.testing.assert_close(torch.tensor(outputs[1][name][1]), torch.tensor(logprobs), rtol=0, atol=1e-4)
        assert outputs[1][name][0] == tokens, name
