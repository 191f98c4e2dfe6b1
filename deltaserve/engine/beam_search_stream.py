"""A beam search run over the AsyncEngine, read as a request's stream: it yields one output, the best beams as
the choices of one finished request, once the search ends. Closing it before then cancels the search and
aborts its beams' requests."""

from __future__ import annotations

import asyncio
from typing import Any

from deltaserve.engine.beam_search import Beam, BeamSearch
from deltaserve.engine.queue_together import queue_together
from deltaserve.outputs import CompletionOutput, RequestOutput


class BeamSearchStream:
    """Runs `search` on `engine` as request `request_id` (its beams' requests are named after it); `decode` gives
    a beam's text from its tokens; `logprobs`: how many top logprobs each choice's tokens carry (None: none)."""

    def __init__(self, engine: Any, request_id: str, search: BeamSearch, *, prompt_text: str | None,
                 decode, include_stop: bool, logprobs: int | None, cache_salt: str | None = None,
                 priority: int = 0):
        self.request_id = request_id
        self._engine, self._search = engine, search
        self._prompt_text, self._decode = prompt_text, decode
        self._include_stop, self._logprobs, self._salt = include_stop, logprobs, cache_salt
        self._priority = priority  # each step's requests are the client request's, ordered as it is
        self._num_cached_tokens: int | None = None
        self.requests_in_flight = 0  # the step's requests (the engine counts them among its streams)
        self._task = asyncio.ensure_future(self._run())
        self._closed = False

    def __aiter__(self) -> BeamSearchStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._closed:
            raise StopAsyncIteration
        try:
            return await asyncio.shield(self._task)
        finally:
            self._closed = self._task.done()

    @property
    def finished(self) -> bool:
        return self._closed

    def when_done(self, callback) -> None:
        """`callback()` once the search has ended, whichever way."""
        self._task.add_done_callback(lambda _: callback())

    def close(self) -> None:
        """Stop listening; a search still running is cancelled and its beams' requests aborted."""
        self._closed = True
        if not self._task.done():
            self._task.cancel()
        elif not self._task.cancelled():
            self._task.exception()  # read, so that a failure nobody awaited is not logged as never retrieved

    async def _run(self) -> RequestOutput:
        search, params = self._search, self._search.step_params()
        step = 0
        while not search.finished:
            prompts = search.next_prompts()
            ids = [f"{self.request_id}-{step}-{i}" for i in range(len(prompts))]
            self.requests_in_flight = len(prompts)
            try:
                outputs = await _one_token_each(self._engine, ids, prompts, params, self._salt, self._priority)
            finally:
                self.requests_in_flight = 0
            if self._num_cached_tokens is None:
                self._num_cached_tokens = outputs[0].num_cached_tokens
            search.advance([o.outputs[0].logprobs[0] for o in outputs])
            step += 1
        return RequestOutput(self.request_id, self._prompt_text, search.prompt,
                             [self._choice(i, beam) for i, beam in enumerate(search.best())], finished=True,
                             num_cached_tokens=self._num_cached_tokens or 0)

    def _choice(self, index: int, beam: Beam) -> CompletionOutput:
        """A beam as a sequence of a finished request: its tokens a stop token ended with, and its text without
        that token's unless include_stop_str_in_output, as the engine writes a stopped sequence's."""
        shown = beam.tokens if self._include_stop or beam.finish_reason != "stop" else beam.tokens[:-1]
        logprobs = None
        if self._logprobs is not None:
            logprobs = [{t: lp for t, lp in entry.items() if t == token or lp.rank <= self._logprobs}
                        for entry, token in zip(beam.logprobs, beam.tokens)]
        return CompletionOutput(index, self._decode(shown), list(beam.tokens), beam.finish_reason,
                                beam.stop_reason, logprobs)


async def _one_token_each(engine: Any, ids: list[str], prompts: list[list[int]], params, salt: str | None,
                          priority: int) -> list[RequestOutput]:
    """Runs one request a prompt, all queued at once (the search's client request was admitted when it began), and
    returns their finished outputs; where one is refused or the search is cancelled, those taken are aborted."""
    streams = await queue_together(engine, [(rid, prompt, params, dict(cache_salt=salt, priority=priority))
                                            for rid, prompt in zip(ids, prompts)])
    try:
        return list(await asyncio.gather(*(_last(s) for s in streams)))
    finally:
        for stream in streams:
            stream.close()  # a finished one is closed already: only one cut short is aborted


async def _last(stream) -> RequestOutput:
    final = None
    async for output in stream:
        final = output
    return final
