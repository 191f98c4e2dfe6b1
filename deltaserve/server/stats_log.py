"""The line vLLM's server logs every VLLM_LOG_STATS_INTERVAL seconds (10 by default) unless --disable-log-stats:
prompt and generation throughput over the interval, running and waiting requests, preemptions in the interval
where there were any, KV cache usage and the prefix cache's hit rate. Where the engine did nothing in the interval
and the one before, the line goes to DEBUG, so that an idle server's log stays quiet (as vLLM's). Where drafts
were verified in the interval, vLLM's speculative decoding line follows it."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from deltaserve.errors import DeltaServeError

logger = logging.getLogger(__name__)

INTERVAL_ENV = ("DELTASERVE_LOG_STATS_INTERVAL", "VLLM_LOG_STATS_INTERVAL")
DEFAULT_INTERVAL = 10.0


def log_stats_interval(disabled: bool, environ=os.environ) -> float | None:
    """Seconds between two lines (None: no line): the first of INTERVAL_ENV that is set, else 10; a value of 0
    or less turns the line off, as vLLM reads its variable."""
    if disabled:
        return None
    for name in INTERVAL_ENV:
        if environ.get(name):
            try:
                seconds = float(environ[name])
            except ValueError:
                raise DeltaServeError(f"{name}={environ[name]!r}: must be a number of seconds") from None
            return seconds if seconds > 0 else None
    return DEFAULT_INTERVAL


class StatsLog:
    def __init__(self, get_stats: Callable[[], Any], clock: Callable[[], float] = time.monotonic):
        self._get_stats = get_stats
        self._clock = clock
        self._since = self._counters(get_stats())
        self._rates = (0.0, 0.0)
        self._drafts_since = self._draft_counters(get_stats())

    def _counters(self, stats) -> tuple[float, int, int, int]:
        """(now, prompt tokens computed, tokens generated, preemptions) so far."""
        total, cached = _read(stats, "prompt_tokens_total"), _read(stats, "prompt_tokens_cached_total")
        return (self._clock(), total - cached, _read(stats, "generation_tokens_total"),
                _read(stats, "num_preemptions"))

    def line(self) -> tuple[str, bool]:
        """The line of the interval since the last one, and whether the engine was idle in both."""
        stats = self._get_stats()
        (then, computed0, generated0, preempted0), now = self._since, self._counters(stats)
        self._since = now
        elapsed = max(now[0] - then, 1e-9)
        rates = (max(now[1] - computed0, 0) / elapsed, max(now[2] - generated0, 0) / elapsed)
        idle = not any(rates + self._rates)
        self._rates = rates
        parts = [f"Engine 000: Avg prompt throughput: {rates[0]:.1f} tokens/s",
                 f"Avg generation throughput: {rates[1]:.1f} tokens/s",
                 f"Running: {_read(stats, 'num_running')} reqs", f"Waiting: {_read(stats, 'num_waiting')} reqs"]
        if now[3] > preempted0:
            parts.append(f"Preemptions: {now[3] - preempted0}")
        parts += [f"GPU KV cache usage: {100 * _read(stats, 'kv_cache_usage'):.1f}%",
                  f"Prefix cache hit rate: {100 * _read(stats, 'prefix_cache_hit_rate'):.1f}%"]
        return ", ".join(parts), idle

    @staticmethod
    def _draft_counters(stats) -> tuple[int, int, int, list[int]]:
        """(verify chunks, drafts verified, drafts kept, kept at each draft position) so far."""
        return (_read(stats, "spec_decode_num_drafts"), _read(stats, "spec_decode_num_draft_tokens"),
                _read(stats, "spec_decode_num_accepted_tokens"),
                list(getattr(stats, "spec_decode_accepted_per_position", None) or []))

    def spec_line(self, elapsed: float) -> str | None:
        """vLLM's speculative decoding line of the interval since the last (None where no draft was verified in
        it): the mean tokens a verify chunk gave (its kept drafts and its own token), the drafts kept and made
        a second, their counts, the share kept at each draft position and in all."""
        (chunks0, drafted0, kept0, per_position0), now = self._drafts_since, self._draft_counters(self._get_stats())
        self._drafts_since = now
        chunks, drafted, kept = now[0] - chunks0, now[1] - drafted0, now[2] - kept0
        if chunks <= 0:
            return None
        per_position0 = per_position0 + [0] * (len(now[3]) - len(per_position0))
        rates = ", ".join(f"{(n - n0) / chunks:.3f}" for n, n0 in zip(now[3], per_position0))
        elapsed = max(elapsed, 1e-9)
        return (f"SpecDecoding metrics: Mean acceptance length: {1 + kept / chunks:.2f}, "
                f"Accepted throughput: {kept / elapsed:.2f} tokens/s, Drafted throughput: {drafted / elapsed:.2f} "
                f"tokens/s, Accepted: {kept} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, "
                f"Avg Draft acceptance rate: {100 * kept / max(drafted, 1):.1f}%")

    def log(self) -> None:
        then = self._since[0]
        text, idle = self.line()
        logger.log(logging.DEBUG if idle else logging.INFO, text)
        spec = self.spec_line(self._since[0] - then)
        if spec is not None:
            logger.info(spec)

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.log()
            except Exception:  # a line not written is no reason to stop serving
                logger.exception("the stats line failed")


def _read(stats: Any, name: str):
    value = getattr(stats, name, 0) if stats is not None else 0
    return value or 0
