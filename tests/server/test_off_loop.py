"""off_loop: a request's slow work on a thread of its own, which the server's shutdown does not wait for: the
request ends at once with the 503 every request in flight gets (it was cancelled by the server's graceful
timeout, a bare 500), and the process does not wait for the thread at exit."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import types

import pytest

from deltaserve.engine.async_engine import ServerShuttingDownError
from deltaserve.server.errors import from_exception
from deltaserve.server.off_loop import off_loop


def test_the_works_result_or_error_comes_back():
    value = random.random()

    def fail():
        raise ValueError(value)

    async def main():
        engine = types.SimpleNamespace(closing=asyncio.Event())
        assert await off_loop(engine, lambda a, b: a + b, value, 1) == value + 1
        with pytest.raises(ValueError, match=str(value)):
            await off_loop(engine, fail)
        assert await off_loop(object(), lambda: value) == value  # an engine that knows no shutdown

    asyncio.run(main())


def test_work_still_running_when_shutdown_begins_ends_the_request_at_once():
    release, seen = threading.Event(), []

    def slow():
        seen.append(threading.current_thread())
        release.wait(30)
        return "late"

    async def main():
        engine = types.SimpleNamespace(closing=asyncio.Event())
        waiting = asyncio.ensure_future(off_loop(engine, slow))
        await asyncio.sleep(random.uniform(0.01, 0.1))
        started = time.monotonic()
        engine.closing.set()
        with pytest.raises(ServerShuttingDownError) as caught:
            await waiting
        assert time.monotonic() - started < 1.0
        error = from_exception(caught.value)
        assert (error.status, error.code) == (503, "shutting_down")
        release.set()
        await asyncio.sleep(0.05)  # its late result is dropped, not set on a finished future

    asyncio.run(main())
    assert seen and seen[0].daemon  # the process does not wait for it at exit
