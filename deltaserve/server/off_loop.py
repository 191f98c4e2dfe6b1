"""off_loop: a request's own slow work (rendering its chat, tokenizing its prompts, compiling its grammar) on a
thread of its own, awaited from the event loop.

As asyncio.to_thread, but the request does not hold the server's shutdown: where the engine begins shutting down
before the work is done, the request ends at once with the 503 every request in flight gets, and the thread's
result is dropped when it comes. The thread is a daemon, so the process does not wait for it at exit either (a
pool's worker would be joined: a prompt of millions of tokens kept the process up for its whole tokenization)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, Callable

from deltaserve.engine.async_engine import ServerShuttingDownError


async def off_loop(engine: Any, func: Callable, *args: Any) -> Any:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            result = context.run(func, *args)
        except BaseException as exc:  # handed to the awaiting request, whatever it is
            loop.call_soon_threadsafe(_settle, done, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, done, result, None)

    threading.Thread(target=run, name="deltaserve-request-work", daemon=True).start()
    closing = getattr(engine, "closing", None)  # an asyncio.Event set as the engine begins shutting down
    if closing is None:
        return await done
    waiting = asyncio.ensure_future(closing.wait())
    try:
        await asyncio.wait((done, waiting), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if done.done():
        return done.result()
    done.cancel()
    raise ServerShuttingDownError("the server is shutting down")


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the request ended first (shutdown, or its client left)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
