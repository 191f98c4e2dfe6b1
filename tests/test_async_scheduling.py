"""Asynchronous scheduling (a decode step is planned and queued before the previous step's tokens are
read back) gives exactly what stepping one at a time gives: the same tokens, finish reasons and
stops, with preemption, prefix caching, aborts and mixed sampling."""

import random

import pytest

from deltaserve import LLM, SamplingParams
from deltaserve.engine.llm_engine import LLMEngine


def _run(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]], abort_after: dict | None = None):
    """Runs the requests together to the end; abort_after maps a request index to the step after
    which it is aborted. Returns {index: (token ids, finish reason)} of the ones not aborted."""
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(str(i), prompt, params)
    done, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[int(out.request_id)] = [(o.token_ids, o.finish_reason) for o in out.outputs]
        steps += 1
        for i, step in (abort_after or {}).items():
            if step == steps and i not in done:
                engine.abort(str(i))
                done[i] = "aborted"
    return done


def _launches(engine: LLMEngine) -> list:
    calls = []
    inner = engine.runner.launch

    def launch(plan, previous):
        calls.append(len(plan.chunks))
        return inner(plan, previous)

    engine.runner.launch = launch
    return calls


def _mixed_requests(rng: random.Random, stop_token: int) -> list[tuple[list[int], SamplingParams]]:
    # Prompts of two blocks or more: with the others' growth they overfill a pool of 12 blocks, so some are
    # preempted (prompts of 3 to 14 tokens all fit, and nothing was).
    prompt = lambda: [rng.randrange(300) for _ in range(rng.randint(24, 60))]  # noqa: E731
    return [
        # The oldest request is never the one preempted, and it outlives the others: its last steps run
        # alone, so some decode steps are launched ahead of their read-back whatever the others do.
        ([rng.randrange(300) for _ in range(5)], SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)),
        (prompt(), SamplingParams(max_tokens=rng.randint(1, 25), temperature=0, ignore_eos=True)),
        (prompt(), SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[stop_token])),
        (prompt(), SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, seed=rng.randrange(1000))),
        (prompt(), SamplingParams(max_tokens=18, temperature=1.0, top_k=20, seed=7, n=2)),
        (prompt(), SamplingParams(max_tokens=12, temperature=0, logprobs=2)),  # read back every step
        (prompt(), SamplingParams(max_tokens=15, temperature=0, repetition_penalty=1.3)),
        (prompt(), SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)),
    ]


@pytest.mark.parametrize("arch", ["qwen3.5", "llama"])
def test_async_scheduling_gives_the_same_outputs(arch, checkpoint_factory):
    path = checkpoint_factory(arch)
    rng = random.Random()
    seed = rng.randrange(10**6)
    # A token the greedy request will meet: its own 6th token in a run without stops.
    probe = LLM(path, device="cpu").generate([[5, 6, 7]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    stop_token = probe[0].outputs[0].token_ids[5]
    results = []
    for overlap in (False, True):
        # A small KV pool: some requests are preempted and recomputed along the way.
        engine = LLMEngine.from_args(path, device="cpu", num_kv_blocks=12, max_model_len=128,
                                     async_scheduling=overlap)
        launches = _launches(engine)
        results.append(_run(engine, _mixed_requests(random.Random(seed), stop_token)))
        stats = engine.stats()
        assert stats.num_running == stats.num_waiting == 0
        assert stats.num_preemptions > 0
        if overlap:
            assert launches  # decode steps did run ahead of their read-back
        else:
            assert not launches
    assert results[0] == results[1]


def test_async_scheduling_abort_while_a_step_runs(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    rng = random.Random()
    requests = [([rng.randrange(300) for _ in range(20)], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
                for _ in range(4)]
    expected = _run(LLMEngine.from_args(path, device="cpu", async_scheduling=False), requests)
    engine = LLMEngine.from_args(path, device="cpu")
    launches = _launches(engine)
    got = _run(engine, requests, abort_after={1: 5, 3: 9})
    assert launches
    assert got[1] == got[3] == "aborted"
    assert {i: got[i] for i in (0, 2)} == {i: expected[i] for i in (0, 2)}
    assert engine.stats().state_slots_used == 0


def test_async_scheduling_multi_turn_prefix_hits_match(checkpoint_factory):
    """Decode-time snapshots are named once their last token is read back; the next turn hits them."""
    path = checkpoint_factory("qwen3.5")
    rng = random.Random()
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    history = [rng.randrange(300) for _ in range(50)]
    messages = [[rng.randrange(300) for _ in range(5)] for _ in range(3)]
    turns = {}
    for overlap in (False, True):
        llm = LLM(path, device="cpu", async_scheduling=overlap, decode_snapshot_interval=16)  # every block
        conversation, outputs = list(history), []
        for message in messages:
            out = llm.generate([conversation], params)[0]
            outputs.append((out.outputs[0].token_ids, out.num_cached_tokens))
            conversation = conversation + out.outputs[0].token_ids + message
        turns[overlap] = outputs
    assert turns[True] == turns[False]
    assert all(cached > 0 for _, cached in turns[True][1:])


def test_async_scheduling_steps_that_look_like_decode_but_start_sequences(checkpoint_factory):
    """A one-token prompt, and a prompt restored from a snapshot up to its last token, make one-row
    steps: they are launched like decode steps and must still reset or restore the state first."""
    path = checkpoint_factory("qwen3.5")
    rng = random.Random()
    one_token = [rng.randrange(300)]
    repeated = [rng.randrange(300) for _ in range(33)]  # a hit restores 32 tokens, 1 is left
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outputs = {}
    for overlap in (False, True):
        llm = LLM(path, device="cpu", async_scheduling=overlap)
        launches = _launches(llm.engine)
        runs = [llm.generate([one_token], params)[0], llm.generate([repeated], params)[0],
                llm.generate([repeated], params)[0]]
        assert runs[2].num_cached_tokens == 32
        outputs[overlap] = [r.outputs[0].token_ids for r in runs]
        assert bool(launches) == overlap
    assert outputs[True] == outputs[False]
    assert outputs[True][1] == outputs[True][2]


def test_generate_returns_with_the_engine_idle_after_a_stop(checkpoint_factory):
    """A stop is known only when its token is read back, by which time the next step has been launched for its
    row: LLM.generate reads that step back too, so the engine it returns is idle (as vLLM's)."""
    llm = LLM(checkpoint_factory("qwen3.5"), device="cpu")
    prompt = [random.randrange(300) for _ in range(12)]
    free = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].outputs[0]
    k = next(i for i in range(2, len(free.token_ids)) if free.token_ids[i] not in free.token_ids[:i])
    launches = _launches(llm.engine)
    out = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                stop_token_ids=[free.token_ids[k]]))[0].outputs[0]
    assert launches and out.token_ids == free.token_ids[: k + 1] and out.finish_reason == "stop"
    assert not llm.engine.has_unfinished_requests() and llm.engine.stats().kv_blocks_used == 0
