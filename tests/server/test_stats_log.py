"""vLLM's periodic stats line: throughputs over the interval from the engine's counters, the gauges as they stand,
DEBUG where the engine idled through this interval and the one before; its interval from vLLM's variable."""

import logging
import random
import re

import pytest

from deltaserve.engine.llm_engine import EngineStats
from deltaserve.errors import DeltaServeError
from deltaserve.server.stats_log import StatsLog, log_stats_interval

LINE = re.compile(r"Engine 000: Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
                  r"Running: (\d+) reqs, Waiting: (\d+) reqs(?:, Preemptions: (\d+))?, GPU KV cache usage: ([\d.]+)%, "
                  r"Prefix cache hit rate: ([\d.]+)%$")


def test_each_line_gives_its_intervals_rates_and_the_gauges_as_they_stand():
    rng = random.Random()
    stats, clock = EngineStats(kv_blocks_total=rng.randint(1, 1000)), [rng.uniform(0, 1000)]
    log = StatsLog(lambda: stats, lambda: clock[0])
    idle_before = True
    for _ in range(rng.randint(3, 12)):
        busy = rng.random() < 0.6
        elapsed = rng.uniform(1, 20)
        computed, cached, generated, preempted = (rng.randint(1, 9000) if busy else 0 for _ in range(4))
        clock[0] += elapsed
        stats.prompt_tokens_total += computed + cached
        stats.prompt_tokens_cached_total += cached
        stats.generation_tokens_total += generated
        stats.num_preemptions += preempted
        stats.num_running, stats.num_waiting = rng.randint(0, 64), rng.randint(0, 64)
        stats.kv_blocks_used = rng.randint(0, stats.kv_blocks_total)
        stats.prefix_cache_queries += rng.randint(1, 100)
        stats.prefix_cache_hits = rng.randint(0, stats.prefix_cache_queries)
        text, idle = log.line()
        fields = LINE.fullmatch(text)
        assert fields, text
        assert float(fields[1]) == pytest.approx(computed / elapsed, abs=0.051)
        assert float(fields[2]) == pytest.approx(generated / elapsed, abs=0.051)
        assert (int(fields[3]), int(fields[4])) == (stats.num_running, stats.num_waiting)
        assert int(fields[5] or 0) == preempted
        assert float(fields[6]) == pytest.approx(100 * stats.kv_blocks_used / stats.kv_blocks_total, abs=0.051)
        assert float(fields[7]) == pytest.approx(100 * stats.prefix_cache_hits / stats.prefix_cache_queries, abs=0.051)
        assert idle == (not busy and idle_before)
        idle_before = not busy


def test_a_busy_line_goes_to_info_and_an_idle_one_to_debug(caplog):
    stats, clock = EngineStats(), [0.0]
    log = StatsLog(lambda: stats, lambda: clock[0])
    caplog.set_level(logging.DEBUG, logger="deltaserve.server.stats_log")
    for generated in (5, 0, 0):
        clock[0] += 10
        stats.generation_tokens_total += generated
        log.log()
    # the interval after a busy one is not idle yet: its line still goes to INFO
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO, logging.DEBUG]


SPEC = re.compile(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+), Accepted throughput: ([\d.]+) tokens/s, "
                  r"Drafted throughput: ([\d.]+) tokens/s, Accepted: (\d+) tokens, Drafted: (\d+) tokens, "
                  r"Per-position acceptance rate: ([\d., ]+), Avg Draft acceptance rate: ([\d.]+)%$")


def test_the_speculative_line_gives_the_intervals_drafts():
    rng = random.Random()
    k = rng.randint(1, 4)
    stats, clock = EngineStats(), [0.0]
    log = StatsLog(lambda: stats, lambda: clock[0])
    for _ in range(rng.randint(2, 6)):
        elapsed, chunks = rng.uniform(1, 20), rng.randint(0, 50)
        kept_each = [rng.randint(0, k) for _ in range(chunks)]
        for kept in kept_each:
            stats.count_verified(k, kept)
        clock[0] += elapsed
        line = log.spec_line(elapsed)
        if not chunks:
            assert line is None
            continue
        fields = SPEC.fullmatch(line)
        assert fields, line
        total = sum(kept_each)
        assert float(fields[1]) == pytest.approx(1 + total / chunks, abs=0.0051)
        assert float(fields[2]) == pytest.approx(total / elapsed, abs=0.0051)
        assert (int(fields[4]), int(fields[5])) == (total, k * chunks)
        rates = [float(r) for r in fields[6].split(", ")]
        assert rates == pytest.approx([sum(n > p for n in kept_each) / chunks for p in range(k)], abs=0.00051)
        assert float(fields[7]) == pytest.approx(100 * total / (k * chunks), abs=0.051)


def test_the_interval_comes_from_vllms_variable():
    seconds = round(random.uniform(0.5, 60), 2)
    assert log_stats_interval(False, {}) == 10.0
    assert log_stats_interval(True, {}) is None  # --disable-log-stats
    assert log_stats_interval(False, {"VLLM_LOG_STATS_INTERVAL": str(seconds)}) == seconds
    assert log_stats_interval(False, {"VLLM_LOG_STATS_INTERVAL": "0"}) is None
    with pytest.raises(DeltaServeError, match="VLLM_LOG_STATS_INTERVAL='soon'"):
        log_stats_interval(False, {"VLLM_LOG_STATS_INTERVAL": "soon"})
