"""`deltaserve serve`, with timestamps of what the server does for each request and each engine step.

    DELTASERVE_TRACE=trace.json python benchmarks/traced_serve.py serve DIR --load-format dummy ...

server_bench.py --trace runs its server so. Every second the file named by DELTASERVE_TRACE is
rewritten with the newest records, on the clock of time.perf_counter (CLOCK_MONOTONIC on Linux, so a
client process on the same machine can set them against its own):
- `requests`: per completion request, when its handler was entered, when it called
  AsyncEngine.generate, when the engine had accepted it, and when its first output reached the
  event loop;
- `steps`: per engine step that queued a decode launch (asynchronous scheduling), when step() began,
  when ModelRunner.launch began and returned, when it began and finished waiting for the previous
  step's tokens, when step() returned, and the number of running requests.
DELTASERVE_SWITCH_INTERVAL, if set, is passed to sys.setswitchinterval (the GIL's hand-over period).
The wrappers add a few microseconds a call, and rewriting the file takes the GIL for a few milliseconds
every second; nothing else about the server changes.
"""

import collections
import contextvars
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from deltaserve.cli import main  # noqa: E402
from deltaserve.engine.async_engine import AsyncEngine, RequestStream  # noqa: E402
from deltaserve.engine.llm_engine import LLMEngine  # noqa: E402
from deltaserve.runner.launched_step import LaunchedStep  # noqa: E402
from deltaserve.runner.model_runner import ModelRunner  # noqa: E402
from deltaserve.server.serving_completions import Completions  # noqa: E402

now = time.perf_counter
KEEP = 4096
requests: dict[str, list] = {}  # request id -> [handler, generate called, accepted, first output]
steps: collections.deque = collections.deque(maxlen=KEEP)
_phase: dict[str, tuple[float, float]] = {}  # the engine thread's current step: phase -> (begin, end)
_handler_entry: contextvars.ContextVar = contextvars.ContextVar("handler_entry", default=None)  # per request task


def _timed(cls, name: str, phase: str) -> None:
    original = getattr(cls, name)

    def timed(*args, **kwargs):
        begin = now()
        try:
            return original(*args, **kwargs)
        finally:
            _phase[phase] = (begin, now())

    setattr(cls, name, timed)


def _trace_steps() -> None:
    _timed(ModelRunner, "launch", "launch")
    _timed(LaunchedStep, "token_ids", "wait")
    original = LLMEngine.step

    def step(self, *args, **kwargs):
        _phase.clear()
        begin = now()
        outputs = original(self, *args, **kwargs)
        if "launch" in _phase and "wait" in _phase:
            steps.append((begin, *_phase["launch"], *_phase["wait"], now(), len(self.scheduler.running)))
        return outputs

    LLMEngine.step = step


def _trace_requests() -> None:
    handler = Completions.__call__

    async def call(self, request):
        _handler_entry.set(now())
        return await handler(self, request)

    Completions.__call__ = call
    generate = AsyncEngine.generate

    async def traced_generate(self, request_id, *args, **kwargs):
        record = [_handler_entry.get(), now(), None, None]
        stream = await generate(self, request_id, *args, **kwargs)
        record[2] = now()
        requests[request_id] = record
        if len(requests) > KEEP:
            del requests[next(iter(requests))]
        return stream

    AsyncEngine.generate = traced_generate
    anext = RequestStream.__anext__

    async def traced_anext(self):
        output = await anext(self)
        record = requests.get(self.request_id)
        if record is not None and record[3] is None:
            record[3] = now()
        return output

    RequestStream.__anext__ = traced_anext


def _write_forever(path: str) -> None:
    while True:
        time.sleep(1.0)
        snapshot = {"requests": dict(requests), "steps": list(steps)}
        with open(path + ".tmp", "w") as f:
            json.dump(snapshot, f)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    if os.environ.get("DELTASERVE_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["DELTASERVE_SWITCH_INTERVAL"]))
    _trace_steps()
    _trace_requests()
    threading.Thread(target=_write_forever, args=(os.environ["DELTASERVE_TRACE"],), daemon=True).start()
    sys.exit(main(sys.argv[1:]))
