"""The requests of one client request queued together: the prompts of a completion, the conversations of a batch,
a beam search step's beams. Over AsyncEngine.generate (any object with its signature)."""

from __future__ import annotations

import asyncio
from typing import Any


async def queue_together(engine: Any, requests: list[tuple[str, list[int], Any, dict]]) -> list:
    """Queues the requests of one client request (request id, prompt, params, generate's keywords) at once, so
    that the engine takes them all at its next step (one after another, each would wait for a step of its own).
    The caller has checked the queue once for the client request: its own requests must not count as waiting ahead
    of each other. Where one is refused, or the caller is cancelled meanwhile (its client gone), the others are
    closed (aborted); the first refusal, in the requests' order, is raised."""
    tasks = [asyncio.ensure_future(engine.generate(request_id, prompt, params, queue_checked=True, **kwargs))
             for request_id, prompt, params, kwargs in requests]
    try:
        taken = await asyncio.gather(*tasks, return_exceptions=True)
    except BaseException:  # cancelled: the adds still waiting abort themselves; close those taken
        await asyncio.gather(*tasks, return_exceptions=True)
        _close_taken(tasks)
        raise
    refused = [r for r in taken if isinstance(r, BaseException)]
    if refused:
        _close_taken(tasks)
        raise refused[0]
    return taken


def _close_taken(tasks: list[asyncio.Future]) -> None:
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is None:
            task.result().close()
