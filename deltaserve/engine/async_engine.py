"""AsyncEngine: the blocking engine loop in its own thread, with asyncio streams for the server.

`LLMEngine.step()` is CPU/GPU work that blocks, so it never runs on the event loop. One thread
owns the engine: it takes commands (add, abort) from a queue between steps, runs steps while
any request is unfinished, and hands each step's outputs to the event loop in one
`call_soon_threadsafe` call. Every stream lives on the event loop thread only.

Outputs are cumulative (text, token ids, logprobs), so a stream keeps just the newest one:
a slow reader skips intermediate outputs without losing anything.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from deltaserve.engine.beam_search_stream import BeamSearchStream
from deltaserve.errors import DeltaServeError, EngineDeadError
from deltaserve.outputs import RequestOutput, RequestStateStats
from deltaserve.sampling_params import BeamSearchParams

logger = logging.getLogger(__name__)


class QueueFullError(DeltaServeError):
    """More requests are waiting for the engine than the server's --max-queue allows."""


class ServerShuttingDownError(DeltaServeError):
    """The server is stopping; requests still in flight are ended with this."""


class RequestIdInUseError(DeltaServeError):
    """A request named as one still in flight (a client's own request_id, on the tokens route)."""


class RequestFailedError(DeltaServeError):
    """The engine aborted the request itself (a failed step), not at the client's wish."""


def engine_max_model_len(engine: Any) -> int:
    value = getattr(engine, "max_model_len", None)
    if value is None:
        value = engine.model_config.max_model_len
    return int(value)


@dataclasses.dataclass
class RequestTiming:
    """What a finished (or abandoned) request tells the metrics."""

    request_id: str
    finish_reason: str  # "stop", "length", "repetition", "abort", "error"
    arrival: float
    first_token: float | None
    finished: float
    prompt_tokens: int
    generation_tokens: int  # the longest of the n outputs
    # where the engine finished the request (its final output came): each sample's finish reason and times
    samples: list[tuple[str, RequestStateStats]] = dataclasses.field(default_factory=list)
    n: int = 1  # the request's n and max_tokens (None: not given)
    max_tokens: int | None = None
    num_cached_tokens: int = 0


@dataclasses.dataclass
class _Stream:
    """The event-loop side of one request: the newest output, or the error that ended it."""

    request_id: str
    event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    latest: RequestOutput | None = None
    error: BaseException | None = None

    def push(self, output: RequestOutput) -> None:
        if self.error is None:
            self.latest = output
            self.event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()

    async def next(self) -> RequestOutput:
        while True:
            await self.event.wait()
            self.event.clear()
            if self.latest is not None and (self.latest.finished or self.error is None):
                output, self.latest = self.latest, None
                return output
            if self.error is not None:
                raise self.error


class AsyncEngine:
    """Runs an LLMEngine in a background thread and streams its outputs to asyncio callers."""

    def __init__(self, engine: Any, *, max_queue: int | None = None, max_num_seqs: int | None = None,
                 log_requests: bool = False, max_log_len: int | None = None):
        self.engine = engine
        self.log_requests = log_requests  # each accepted request's parameters at INFO, its prompt at DEBUG
        self.max_log_len = max_log_len  # vLLM's: the most characters (or token ids) of a prompt logged
        self.tokenizer = engine.tokenizer
        self.model_name: str = getattr(engine, "model_name", "model")
        self.max_model_len: int = engine_max_model_len(engine)
        self.sampling_defaults: dict = getattr(engine, "sampling_defaults", {})
        self.max_tokens_cap: int | None = getattr(engine, "max_tokens_cap", None)  # (sampling_defaults.py)
        self.max_logprobs: int = engine.max_logprobs  # resolved: the whole vocabulary where it was -1
        self.vocab_size: int = engine.vocab_size
        self.think_tags: tuple[int, int] | None = getattr(engine, "think_tags", None)  # (<think>, </think>) ids
        cache_info = getattr(engine, "cache_config_info", None)
        self.cache_config_info: dict[str, str] = cache_info() if cache_info is not None else {}
        self.max_queue = max_queue
        # vLLM's: under "priority" a request's priority orders it; under "fcfs" only 0 is taken (refuse_unsupported)
        self.scheduling_policy: str = getattr(getattr(engine, "config", None), "scheduling_policy", "fcfs")
        # the most sequences a step runs: given, else the engine's own
        self.max_num_seqs = max_num_seqs if max_num_seqs is not None else getattr(
            getattr(engine, "config", None), "max_num_seqs", None)
        self.stats: Any = None  # the engine's newest stats(), refreshed by the engine thread
        self.listeners: list[Callable[[RequestTiming], None]] = []
        self.refusal_listeners: list[Callable[[DeltaServeError], None]] = []  # told of each refused request

        self._commands: collections.deque = collections.deque()
        self._wakeup = threading.Event()
        self._stopping = False
        self._closing = False
        self._draining = False  # a graceful shutdown's wait: new requests refused, those admitted run on
        self._searches: set = set()  # beam searches running (BeamSearchStream)
        self._dead: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, _Stream] = {}
        self.closing: asyncio.Event | None = None  # set as shutdown begins: work a request awaits ends (off_loop)

    @classmethod
    def from_args(cls, model: str | None = None, *, max_queue: int | None = None, log_requests: bool = False,
                  max_log_len: int | None = None, **engine_kwargs):
        from deltaserve.engine.llm_engine import LLMEngine

        engine = LLMEngine.from_args(model, **engine_kwargs)
        return cls(engine, max_queue=max_queue, max_num_seqs=engine_kwargs.get("max_num_seqs"),
                   log_requests=log_requests, max_log_len=max_log_len)

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread; call from the event loop that will consume the streams."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.closing = asyncio.Event()
        self._refresh_stats()
        self._thread = threading.Thread(target=self._run, name="deltaserve-engine", daemon=True)
        self._thread.start()

    def fail_all(self, error: BaseException) -> None:
        """End every stream in flight with `error` and abort its request (event loop thread)."""
        for request_id, stream in list(self._streams.items()):
            stream.fail(error)
            self._submit(("abort", request_id))

    def refuse_new(self) -> None:
        """Refuse new requests (and end the work of those not yet queued) while those in flight run on: the wait
        of a graceful shutdown (vLLM's --shutdown-timeout). A request admitted before goes on queueing what it
        needs (a beam search its next step's requests)."""
        self._draining = True
        if self.closing is not None:
            self.closing.set()

    def begin_shutdown(self) -> None:
        """Refuse new requests and end those in flight; the thread runs on to free their blocks."""
        self.refuse_new()
        self._closing = True
        self.fail_all(ServerShuttingDownError("the server is shutting down"))

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the engine thread after the step in progress."""
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def is_alive(self) -> bool:
        return self._dead is None and not self._stopping and not self._closing and not self._draining

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_busy(self) -> int:
        """Client requests not done: the requests in flight, a beam search counted once whether or not its step's
        requests are among them (between two steps it has none)."""
        steps = sum(search.requests_in_flight for search in self._searches)
        return max(len(self._streams) - steps, 0) + len(self._searches)

    # ---- requests --------------------------------------------------------------------------

    def check_admission(self) -> None:
        """Raise before a request is accepted when the engine is gone or the queue is full. Call it once per
        client request (its prompts are queued with queue_checked=True): a refusal is told to the
        refusal_listeners, so that each refused request is counted once, however it was refused."""
        try:
            self._check_alive()
            if self._draining:
                raise ServerShuttingDownError("the server is shutting down")
            self._check_queue()
        except DeltaServeError as exc:
            for listener in self.refusal_listeners:
                listener(exc)
            raise

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine loop stopped: {self._dead!r}")
        if self._stopping or self._closing:
            raise ServerShuttingDownError("the server is shutting down")

    def _check_queue(self) -> None:
        if self.max_queue is None:
            return
        # the stats are the last step's: the requests that came since count as running, up to max_num_seqs
        running = int(getattr(self.stats, "num_running", None) or 0)
        if self.max_num_seqs is not None:
            running = max(running, min(self.num_in_flight, self.max_num_seqs))
        waiting = self.num_in_flight - min(running, self.num_in_flight)
        if waiting >= self.max_queue:
            raise QueueFullError(
                f"{waiting} requests are already waiting for the engine (--max-queue {self.max_queue}); "
                "retry later"
            )

    async def generate(
        self,
        request_id: str,
        prompt: str | list[int],
        params: Any,
        *,
        prompt_text: str | None = None,
        capture_points: list[int] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        queue_checked: bool = False,
    ) -> "RequestStream":
        """Queue a request; return its stream once the engine has accepted it.

        The engine's validation errors are raised here, before anything was queued. The caller
        iterates the stream and must `close()` it (closing an unfinished stream aborts it).
        queue_checked: the caller ran check_admission for the client request this is one prompt of; its
        other prompts, queued with it, must not count as waiting ahead of it (they would refuse each other).
        """
        if queue_checked:
            self._check_alive()
        else:
            self.check_admission()
        if request_id in self._streams:
            raise RequestIdInUseError(f"request id {request_id!r} is already in flight")
        loop = asyncio.get_running_loop()
        stream = _Stream(request_id)
        self._streams[request_id] = stream
        added = loop.create_future()
        kwargs = {}
        if prompt_text is not None:
            kwargs["prompt_text"] = prompt_text
        if capture_points is not None:
            kwargs["capture_points"] = capture_points
        if cache_salt is not None:
            kwargs["cache_salt"] = cache_salt
        if priority:
            kwargs["priority"] = priority
        arrival = time.perf_counter()
        self._submit(("add", request_id, prompt, params, kwargs, added))
        try:
            await added
        except BaseException:
            self._streams.pop(request_id, None)
            if not added.done():  # cancelled while waiting: the add may still happen
                added.cancel()
                self._submit(("abort", request_id))
            raise
        if self.log_requests:
            logger.info("request %s accepted: %s", request_id, params)
            shown = prompt_text if prompt_text is not None else prompt
            logger.debug("request %s prompt: %r", request_id, shown[: self.max_log_len])
        return RequestStream(self, stream, arrival, getattr(params, "n", 1), getattr(params, "max_tokens", None))

    async def beam_search(self, request_id: str, prompt: list[int], params: BeamSearchParams, *,
                          prompt_text: str | None, decode: Callable[[list[int]], str], top_logprobs: int | None,
                          cache_salt: str | None = None, priority: int = 0) -> BeamSearchStream:
        """Start a beam search (engine/beam_search_stream.py): its stream yields the best beams as one finished
        output. Its beams' requests are queued as one client request's, checked against the queue here, once.
        decode: a beam's text from its tokens; top_logprobs: how many each result token carries (None: none)."""
        self.check_admission()
        search = self.engine.beam_search(prompt, params, top_logprobs or 0)  # reads the engine's settings alone
        stream = BeamSearchStream(self, request_id, search, prompt_text=prompt_text, decode=decode,
                                  include_stop=params.include_stop_str_in_output, logprobs=top_logprobs,
                                  cache_salt=cache_salt, priority=priority)
        self._searches.add(stream)
        stream.when_done(lambda: self._searches.discard(stream))
        return stream

    def add_step_listener(self, listener: Callable[[Any], None]) -> None:
        """`listener` is told of each engine step's StepStats (LLMEngine.step_listeners), on the engine's
        thread; an engine without step listeners tells it nothing."""
        listeners = getattr(self.engine, "step_listeners", None)
        if listeners is not None:
            listeners.append(listener)

    async def reset_prefix_cache(self) -> None:
        """Forgets every cached block and snapshot that no running request holds, between two engine steps."""
        self._check_alive()  # no request: the queue's length does not matter, and nothing is refused
        done = asyncio.get_running_loop().create_future()
        self._submit(("reset_prefix_cache", done))
        await done

    async def start_profile(self, prefix: str | None = None) -> None:
        """The engine's profiler starts, between two engine steps (LLMEngine.start_profile)."""
        await self._between_steps("start_profile", prefix)

    async def stop_profile(self) -> None:
        """The engine's profiler stops and writes its trace, between two engine steps."""
        await self._between_steps("stop_profile")

    async def _between_steps(self, method: str, *args) -> None:
        self._check_alive()
        done = asyncio.get_running_loop().create_future()
        self._submit(("call", method, args, done))
        await done

    # ---- engine thread -----------------------------------------------------------------------

    def _submit(self, command: tuple) -> None:
        self._commands.append(command)
        self._wakeup.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wakeup.clear()
            changed = self._drain_commands()
            if not self.engine.has_unfinished_requests():
                if changed:
                    self._refresh_stats()
                self._wakeup.wait()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # the engine is in an unknown state: serve no more
                logger.exception("engine step failed")
                self._die(exc)
                return
            self._refresh_stats()
            if outputs:
                self._call_in_loop(self._dispatch, outputs)  # the engine never touches them again

    def _drain_commands(self) -> bool:
        changed = False
        while self._commands:
            command = self._commands.popleft()
            changed = True
            if command[0] == "add":
                _, request_id, prompt, params, kwargs, added = command
                if added.cancelled():
                    continue
                try:
                    self.engine.add_request(request_id, prompt, params, **kwargs)
                except Exception as exc:
                    self._call_in_loop(_settle, added, exc)
                else:
                    self._call_in_loop(_settle, added, None)
            elif command[0] == "abort":
                try:
                    self.engine.abort(command[1])
                except Exception:  # already finished, or never added
                    pass
            elif command[0] == "reset_prefix_cache":
                self._call_on_engine("reset_prefix_cache", (), command[1])
            elif command[0] == "call":
                self._call_on_engine(*command[1:])
        return changed

    def _call_on_engine(self, method: str, args: tuple, done: asyncio.Future) -> None:
        try:
            getattr(self.engine, method)(*args)
        except Exception as exc:
            self._call_in_loop(_settle, done, exc)
        else:
            self._call_in_loop(_settle, done, None)

    def _refresh_stats(self) -> None:
        try:
            self.stats = copy.copy(self.engine.stats())  # the engine may update its object in place
        except Exception:
            logger.exception("engine stats() failed")

    def _die(self, exc: BaseException) -> None:
        self._dead = exc
        error = EngineDeadError(f"the engine loop stopped after an internal error: {exc!r}")

        def fail_everything() -> None:
            for stream in list(self._streams.values()):
                stream.fail(error)
            while self._commands:
                command = self._commands.popleft()
                if command[0] in ("add", "reset_prefix_cache"):  # each waits on the future it ends with
                    _settle(command[-1], error)

        self._call_in_loop(fail_everything)

    def _call_in_loop(self, fn: Callable, *args) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    # ---- event loop side -------------------------------------------------------------------

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.push(output)

    def _notify(self, timing: RequestTiming) -> None:
        for listener in self.listeners:
            try:
                listener(timing)
            except Exception:
                logger.exception("request listener failed")


class RequestStream:
    """Async iterator over one request's cumulative outputs, ending with the finished one."""

    def __init__(self, engine: AsyncEngine, stream: _Stream, arrival: float, n: int = 1,
                 max_tokens: int | None = None):
        self.request_id = stream.request_id
        self._engine = engine
        self._stream = stream
        self._arrival = arrival
        self._n, self._max_tokens = n, max_tokens
        self._first_token: float | None = None
        self._last: RequestOutput | None = None
        self._closed = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._closed:
            raise StopAsyncIteration
        try:
            output = await self._stream.next()
        except (EngineDeadError, ServerShuttingDownError):
            self._finish("error")
            raise
        self._last = output
        if self._first_token is None and any(o.token_ids for o in output.outputs):
            self._first_token = time.perf_counter()
        if output.finished:
            reasons = [o.finish_reason for o in output.outputs]
            if "abort" in reasons:  # only the engine aborts a request whose stream is still open
                self._finish("error")
                if output.error is not None:  # the request's own fault (its constraints left no token)
                    raise output.error
                raise RequestFailedError("the engine failed while running this request")
            self._finish(next((r for r in ("length", "repetition") if r in reasons), "stop"))
        return output

    @property
    def finished(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop listening; a request that has not finished is aborted in the engine."""
        if not self._closed:
            self._finish("abort")

    def _finish(self, reason: str) -> None:
        self._closed = True
        engine = self._engine
        if engine._streams.get(self.request_id) is self._stream:
            del engine._streams[self.request_id]
        if reason in ("abort", "error"):
            engine._submit(("abort", self.request_id))
        last = self._last
        engine._notify(
            RequestTiming(
                request_id=self.request_id,
                finish_reason=reason,
                arrival=self._arrival,
                first_token=self._first_token,
                finished=time.perf_counter(),
                prompt_tokens=len(last.prompt_token_ids) if last else 0,
                generation_tokens=max((len(o.token_ids) for o in last.outputs), default=0) if last else 0,
                samples=[(o.finish_reason, o.metrics) for o in last.outputs if o.metrics is not None]
                if last and last.finished else [],
                n=self._n,
                max_tokens=self._max_tokens,
                num_cached_tokens=last.num_cached_tokens if last else 0,
            )
        )


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
