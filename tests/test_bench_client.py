"""The bench client's statistics and report, on measurements written out by hand."""

from __future__ import annotations

import math
import random

import pytest

from deltaserve.bench.report import format_table
from deltaserve.bench.serve import BenchArgumentError, completions_url, parse_levels
from deltaserve.bench.stats import RequestResult, percentile, summarize
from deltaserve.bench.workload import length_range, make_requests, parse_range_ratio


def test_percentile_matches_linear_interpolation():
    values = [10.0, 1.0, 4.0, 7.0]  # sorted: 1 4 7 10
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 10.0
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_tpot_excludes_the_first_token():
    r = RequestResult(ok=True, output_tokens=5, latency=1.0, ttft=0.2)
    assert r.tpot == pytest.approx(0.2)
    assert RequestResult(ok=True, output_tokens=1, latency=1.0, ttft=0.2).tpot is None


def test_summarize_counts_rates_and_distributions():
    results = [
        RequestResult(ok=True, prompt_tokens=8, output_tokens=4, latency=0.5, ttft=0.2, itls=[0.1, 0.1, 0.1]),
        RequestResult(ok=True, prompt_tokens=8, output_tokens=4, latency=0.8, ttft=0.2, itls=[0.2, 0.2, 0.2]),
        RequestResult(ok=False, prompt_tokens=8, error="HTTP 503: full"),
    ]
    s = summarize(2, results, duration=2.0, expected_output_len=4, expected_input_len=8)
    assert s["concurrency"] == 2
    assert (s["requests_ok"], s["requests_failed"]) == (2, 1)
    assert s["output_tok_s"] == pytest.approx(4.0)  # 8 tokens / 2 s
    assert s["total_tok_s"] == pytest.approx(12.0)  # (8 + 16) / 2 s
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(150.0)  # (100 + 200) / 2
    assert s["itl_ms"]["p90"] == pytest.approx(200.0)
    assert s["itl_ms"]["mean"] == pytest.approx(150.0)
    assert s["output_len_mismatches"] == 0 and s["input_len_mismatches"] == 0
    assert s["errors"] == ["HTTP 503: full"]


def test_report_table_has_a_row_per_level():
    row = summarize(4, [RequestResult(ok=True, prompt_tokens=8, output_tokens=2, latency=0.3, ttft=0.1,
                                      itls=[0.2])], 1.0, 2)
    report = {"model": "m", "base_url": "http://127.0.0.1:1", "input_len": 8, "output_len": 2, "num_prompts": 1,
              "results": [row, dict(row, concurrency=8)]}
    lines = format_table(report).splitlines()
    assert "TTFT ms p50/p90/p99" in lines[1]
    assert lines[3].split()[0] == "4" and lines[4].split()[0] == "8"
    assert "100.0/100.0/100.0" in lines[3]
    assert "input 8 tokens, output 2 tokens, 1 prompts" in lines[0]
    drawn = format_table(dict(report, random_range_ratio={"input": 0.25, "output": 0}, random_prefix_len=4))
    assert "input 4 shared + 8 (+/-25%) tokens, output 2 tokens" in drawn.splitlines()[0]


def test_prompts_have_exact_length_and_differ_by_seed():
    a = make_requests(3, 17, 5, (0.0, 0.0), 0, 1000, 2000, seed=1)
    assert [len(r.prompt) for r in a] == [17, 17, 17] and [r.output_len for r in a] == [5, 5, 5]
    assert all(1000 <= t < 2000 for r in a for t in r.prompt)
    assert a == make_requests(3, 17, 5, (0.0, 0.0), 0, 1000, 2000, seed=1)
    assert a != make_requests(3, 17, 5, (0.0, 0.0), 0, 1000, 2000, seed=2)


def test_lengths_are_drawn_over_vllms_range_after_a_shared_prefix():
    """With range ratios each length is uniform over [floor(L (1 - r)), ceil(L (1 + r))] (vLLM's random
    dataset), an output at least 1; every prompt opens with the same prefix_len ids."""
    rng = random.Random()
    input_len, output_len, prefix_len = rng.randint(5, 40), rng.randint(1, 30), rng.randint(0, 9)
    ratios = (rng.uniform(0, 0.99), rng.uniform(0, 0.99))
    requests = make_requests(3000, input_len, output_len, ratios, prefix_len, 1000, 2000, seed=rng.randrange(99))
    inputs = {len(r.prompt) - prefix_len for r in requests}
    outputs = {r.output_len for r in requests}
    low, high = math.floor(input_len * (1 - ratios[0])), math.ceil(input_len * (1 + ratios[0]))
    assert inputs == set(range(low, high + 1))  # every length of the range drawn, none outside
    low, high = max(1, math.floor(output_len * (1 - ratios[1]))), math.ceil(output_len * (1 + ratios[1]))
    assert outputs == set(range(low, high + 1))
    assert len({tuple(r.prompt[:prefix_len]) for r in requests}) == 1
    # their own ids after it: 4-id openings, among those long enough to have one (a range ratio near 1 draws many
    # prompts of 0 to 3 ids of their own), collide hardly ever (1000 ids a position)
    own = [tuple(r.prompt[prefix_len:prefix_len + 4]) for r in requests if len(r.prompt) >= prefix_len + 4]
    assert len(own) > 1000 and len(set(own)) >= len(own) - 2
    assert length_range(10, 0.0) == (10, 10) and length_range(1, 0.5, at_least=1) == (1, 2)


def test_a_range_ratio_is_a_number_or_vllms_object_of_two():
    assert parse_range_ratio("0.25") == (0.25, 0.25)
    assert parse_range_ratio('{"input": 0.1, "output": 0.5}') == (0.1, 0.5)


def test_mismatches_count_against_each_requests_own_lengths():
    asked = [RequestResult(ok=True, prompt_tokens=n, output_tokens=m, latency=1.0, ttft=0.1, sent_prompt_tokens=n,
                           asked_output_tokens=m) for n, m in ((5, 3), (9, 7))]
    short = RequestResult(ok=True, prompt_tokens=6, output_tokens=2, latency=1.0, ttft=0.1, sent_prompt_tokens=5,
                          asked_output_tokens=3)
    row = summarize(2, asked + [short], 1.0, expected_output_len=4, expected_input_len=4)
    assert (row["output_len_mismatches"], row["input_len_mismatches"]) == (1, 1)


def test_arguments():
    assert parse_levels("1,2,4") == [1, 2, 4]
    for bad in ("1,0", "a", ""):
        with pytest.raises(BenchArgumentError, match="--concurrency needs positive integers"):
            parse_levels(bad)
    assert completions_url("http://h:1") == "http://h:1/v1/completions"
    assert completions_url("http://h:1/v1/") == "http://h:1/v1/completions"


def test_a_base_url_the_client_cannot_speak_is_named():
    import argparse
    import asyncio

    from deltaserve.bench.serve import run_benchmark

    args = argparse.Namespace(base_url="ftp://127.0.0.1:1", model="m", concurrency="2", input_len=4, output_len=2,
                              num_prompts=1, seed=0, api_key=None, token_id_range="1000:2000", warmup=0, timeout=1.0)
    with pytest.raises(BenchArgumentError, match="--base-url: the bench speaks http and https, not 'ftp'"):
        asyncio.run(run_benchmark(args))


def test_arrival_gaps_average_one_over_the_rate_and_spread_by_burstiness():
    import math
    import random

    from deltaserve.bench.serve import arrival_gaps

    rng = random.Random()
    assert arrival_gaps(5, math.inf, 1.0, rng) == [0.0] * 5
    rate = rng.uniform(1, 100)
    for burstiness in (0.5, 1.0, 4.0):
        gaps = arrival_gaps(40000, rate, burstiness, rng)
        mean = sum(gaps) / len(gaps)
        variance = sum((g - mean) ** 2 for g in gaps) / len(gaps)
        assert mean == pytest.approx(1 / rate, rel=0.05)
        # a gamma of shape k and mean m has variance m^2 / k: the smaller k, the burstier the arrivals
        assert variance == pytest.approx(1 / rate ** 2 / burstiness, rel=0.15)


@pytest.mark.parametrize("flags, message", [
    (["--dataset-name", "sharegpt"], "--dataset-name sharegpt: only random token-id prompts"),
    (["--random-range-ratio", "1"], r"--random-range-ratio 1: each ratio must be in \[0, 1\)"),
    (["--random-range-ratio", '{"input": 0.2}'], "a number, or a JSON object with 'input' and 'output'"),
    (["--random-input-len", "1", "--random-range-ratio", "0.5"], "a prompt could have no token"),
    (["--random-output-len", "0"], "--random-output-len at least 1"),
    (["--backend", "openai-chat"], "--backend openai-chat: vllm or openai"),
    (["--endpoint", "/v1/chat/completions"], "--endpoint /v1/chat/completions: only /v1/completions"),
    (["--concurrency", "2", "--max-concurrency", "4"], "--concurrency and --max-concurrency: give one of them"),
    (["--request-rate", "0"], "--request-rate and --burstiness must be positive"),
    (["--request-rate", "5", "--burstiness", "inf"], r"--request-rate and --burstiness must be positive \(the "
                                                     "burstiness finite"),
    (["--num-prompts", "0"], "--num-prompts must be at least 1"),
    (["--token-id-range", "5"], "--token-id-range '5': LOW:HIGH, two ids with 0 <= LOW < HIGH"),
    (["--token-id-range", "300:10"], "--token-id-range '300:10': LOW:HIGH"),
    (["--token-id-range", "10:10"], "--token-id-range '10:10': LOW:HIGH"),
    (["--metric-percentiles", "50,101"], "--metric-percentiles needs numbers from 0 to 100"),
    (["--percentile-metrics", "ttft,goodput"], "--percentile-metrics 'ttft,goodput': name some of"),
])
def test_what_the_client_cannot_do_is_named(flags, message):
    import argparse

    from deltaserve.bench.serve import add_arguments, check_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(BenchArgumentError, match=message):
        check_arguments(parser.parse_args(flags))


def test_vllms_result_fields_carry_the_same_figures():
    import random
    import statistics

    rng = random.Random()
    results = []
    for _ in range(rng.randint(1, 30)):
        ok = rng.random() < 0.8
        ttft = rng.uniform(0.01, 1)
        out = rng.randint(1, 50)
        results.append(RequestResult(ok=ok, prompt_tokens=rng.randint(1, 500), output_tokens=out,
                                     latency=ttft + out * rng.uniform(0.001, 0.05), ttft=ttft if ok else None,
                                     itls=[rng.uniform(0.001, 0.05) for _ in range(out - 1)]))
    duration = rng.uniform(1, 100)
    row = summarize(4, results, duration, 50, None, percentiles=(50, 99.9))
    done = [r for r in results if r.ok]
    assert row["completed"] == row["requests_ok"] == len(done) and row["failed"] == len(results) - len(done)
    assert row["total_output_tokens"] == row["output_tokens"]
    assert row["output_throughput"] == pytest.approx(row["output_tok_s"])
    assert row["request_throughput"] == pytest.approx(len(done) / duration)
    for name, ours in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "itl_ms"), ("e2el", "e2e_ms")):
        if row[ours]["mean"] is None:
            continue
        assert row[f"mean_{name}_ms"] == pytest.approx(row[ours]["mean"])
        assert row[f"median_{name}_ms"] == pytest.approx(row[ours]["p50"])
        assert row[f"p99.9_{name}_ms"] == pytest.approx(row[ours]["p99.9"])
    gaps_ms = [g * 1000 for r in done for g in r.itls]
    if gaps_ms:
        assert row["std_itl_ms"] == pytest.approx(statistics.pstdev(gaps_ms))


def test_one_levels_figures_print_as_vllm_prints_them():
    import random
    import re

    from deltaserve.bench.report import format_vllm_summary

    rng = random.Random()
    results = [RequestResult(ok=True, prompt_tokens=rng.randint(1, 300), output_tokens=n,
                             latency=rng.uniform(0.5, 2), ttft=rng.uniform(0.01, 0.4),
                             itls=[rng.uniform(0.001, 0.05) for _ in range(n - 1)])
               for n in (rng.randint(2, 40) for _ in range(rng.randint(1, 20)))]
    row = summarize(8, results, rng.uniform(1, 30), 40, None, percentiles=(50, 95))
    text = format_vllm_summary(row, ("ttft", "e2el"), (50, 95), max_concurrency=8, request_rate=2.5)
    lines = dict(re.fullmatch(r"(.+?):\s+(\S+)\s*", line).groups() for line in text.splitlines() if ":" in line)
    assert int(lines["Successful requests"]) == len(results) and int(lines["Maximum request concurrency"]) == 8
    assert float(lines["Request rate configured (RPS)"]) == 2.5
    assert int(lines["Total generated tokens"]) == sum(r.output_tokens for r in results)
    assert float(lines["Output token throughput (tok/s)"]) == round(row["output_throughput"], 2)
    for short, name in (("TTFT", "ttft"), ("E2EL", "e2el")):
        assert float(lines[f"Mean {short} (ms)"]) == round(row[f"mean_{name}_ms"], 2)
        assert float(lines[f"P95 {short} (ms)"]) == round(row[f"p95_{name}_ms"], 2)
    assert "TPOT" not in text and text.startswith("=" * 12 + " Serving Benchmark Result ")
