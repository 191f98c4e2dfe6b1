"""A completions request of many prompts queues them all at once (the engine takes them at one step), and where
one is refused or the client leaves, the others it holds are closed: submit_prompts against an engine that, as
AsyncEngine does, takes the requests queued to it only when it steps."""

from __future__ import annotations

import asyncio
import random

import pytest

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

    async def generate(self, request_id, token_ids, params, *, prompt_text=None, cache_salt=None):
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
