"""A completions request of many prompts queues them all at once (the engine takes them at one step), and where
one is refused or the client leaves, the others it holds are closed: submit_prompts against an engine that, as
AsyncEngine does, takes the requests queued to it only when it steps."""

from __future__ import annotations

import asyncio
import random

import types

import pytest

from deltaserve.engine.async_engine import AsyncEngine, QueueFullError
from deltaserve.errors import DeltaServeError
from deltaserve.server.serving_completions import _Prompt, submit_prompts


class _Stream:
    def __init__(self, request_id: str, closed: list[str]):
        self.request_id, self._closed = request_id, closed

    def close(self) -> None:
        self._closed.append(self.request_id)


class _SteppingEngine:
    """generate() returns once the engine has stepped past the add (or raises, for a refused id); a caller
    cancelled while waiting leaves the add aborted."""

    def __init__(self, refused: set[str] = frozenset()):
        self.queued: list[tuple[str, asyncio.Future]] = []
        self.refused, self.closed, self.aborted = refused, [], []
        self.admission_checks, self.unchecked = 0, []

    def check_admission(self) -> None:
        self.admission_checks += 1

    async def generate(self, request_id, token_ids, params, *, prompt_text=None, cache_salt=None, priority=0,
                       queue_checked=False):
        if not queue_checked:
            self.unchecked.append(request_id)
        taken = asyncio.get_running_loop().create_future()
        self.queued.append((request_id, taken))
        try:
            await taken
        except asyncio.CancelledError:
            self.aborted.append(request_id)
            raise
        if request_id in self.refused:
            raise DeltaServeError(f"{request_id} refused")
        return _Stream(request_id, self.closed)

    def step(self, limit: int | None = None) -> None:
        """Takes the queued adds (the first `limit` of them)."""
        for _, future in self.queued[:limit]:
            if not future.done():
                future.set_result(None)


def _prompts(n: int) -> tuple[list[_Prompt], list[None]]:
    return [_Prompt(None, [random.randrange(100)]) for _ in range(n)], [None] * n


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_every_prompt_is_queued_before_the_engine_steps():
    async def run():
        n = random.randint(2, 40)
        engine = _SteppingEngine()
        task = asyncio.ensure_future(submit_prompts(engine, "cmpl-x", *_prompts(n), None))
        await _settle()
        assert len(engine.queued) == n and not task.done()  # all waiting for the same step
        engine.step()
        streams = await task
        assert [s.request_id for s in streams] == [f"cmpl-x-{k}" for k in range(n)]
        assert engine.closed == [] and engine.aborted == []
        # the queue is checked once for the request, not per prompt (its prompts would refuse each other)
        assert engine.admission_checks == 1 and engine.unchecked == []
    asyncio.run(run())


def test_a_refused_prompt_closes_the_others_and_the_first_refusal_is_raised():
    async def run():
        n = random.randint(3, 30)
        refused = sorted(random.sample(range(n), random.randint(1, n - 1)))
        engine = _SteppingEngine({f"cmpl-x-{k}" for k in refused})
        task = asyncio.ensure_future(submit_prompts(engine, "cmpl-x", *_prompts(n), None))
        await _settle()
        engine.step()
        with pytest.raises(DeltaServeError, match=f"cmpl-x-{refused[0]} refused"):
            await task
        assert sorted(engine.closed) == sorted(f"cmpl-x-{k}" for k in range(n) if k not in refused)
    asyncio.run(run())


def test_a_caller_cancelled_midway_closes_what_was_taken_and_aborts_the_rest():
    async def run():
        n = random.randint(2, 30)
        taken = random.randint(0, n - 1)
        engine = _SteppingEngine()
        task = asyncio.ensure_future(submit_prompts(engine, "cmpl-x", *_prompts(n), None))
        await _settle()
        engine.step(limit=taken)
        await _settle()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ids = [f"cmpl-x-{k}" for k in range(n)]
        assert sorted(engine.closed) == sorted(ids[:taken]) and sorted(engine.aborted) == sorted(ids[taken:])
    asyncio.run(run())


class _IdleEngine:
    """An LLMEngine that takes requests and never steps: every request queued stays waiting."""

    tokenizer, model_name, max_model_len, max_logprobs, vocab_size = None, "idle", 64, 20, 100

    def stats(self):
        return types.SimpleNamespace(num_running=0)

    def add_request(self, request_id, prompt, params, **kwargs) -> None:
        pass

    def has_unfinished_requests(self) -> bool:
        return False

    def abort(self, request_id) -> None:
        pass


def test_a_full_queue_refuses_other_requests_not_the_prompts_of_one_and_each_refusal_is_told():
    """--max-queue counts other requests waiting: the prompts of one admitted request are queued however many
    they are, a request checked afterwards is refused, and each refusal reaches the refusal listeners (the
    server's metrics)."""
    async def run():
        limit = random.randint(1, 4)
        engine = AsyncEngine(_IdleEngine(), max_queue=limit)
        refusals: list[BaseException] = []
        engine.refusal_listeners.append(refusals.append)
        engine.start()
        try:
            prompts, params = _prompts(limit + random.randint(1, 5))
            streams = await submit_prompts(engine, "cmpl-x", prompts, params, None)
            assert len(streams) == len(prompts) and refusals == []
            with pytest.raises(QueueFullError):
                await submit_prompts(engine, "cmpl-y", *_prompts(2), None)
            with pytest.raises(QueueFullError):
                await engine.generate("chat-z", [1, 2], None)
            assert [type(r) for r in refusals] == [QueueFullError, QueueFullError]
            for stream in streams:
                stream.close()
        finally:
            engine.stop()
    asyncio.run(run())


def test_requests_since_the_last_step_count_as_running_up_to_the_engines_max_num_seqs():
    """The engine's stats are its last step's (here: none runs): the requests that came since count as running
    up to its config's max_num_seqs, then as waiting up to --max-queue."""
    async def run():
        seqs, limit = random.randint(1, 4), random.randint(1, 3)
        idle = _IdleEngine()
        idle.config = types.SimpleNamespace(max_num_seqs=seqs)
        engine = AsyncEngine(idle, max_queue=limit)
        engine.start()
        try:
            streams = [await engine.generate(f"r{k}", [1, 2], None) for k in range(seqs + limit)]
            with pytest.raises(QueueFullError):
                await engine.generate("one-more", [1, 2], None)
            for stream in streams:
                stream.close()
        finally:
            engine.stop()
    asyncio.run(run())
