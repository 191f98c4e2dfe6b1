"""`deltaserve bench serve` against the live server: a complete report with zero errors."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.server.conftest import API_KEY, MODEL
from tests.server.live_server import REPO_ROOT

pytestmark = pytest.mark.timeout(300)


def test_bench_serve_reports_every_level(server, tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "deltaserve.cli", "bench", "serve", "--base-url", server.url, "--model", MODEL,
               "--concurrency", "1,4", "--input-len", "24", "--output-len", "6", "--num-prompts", "4",
               "--seed", "3", "--api-key", API_KEY, "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TTFT ms p50/p90/p99" in done.stdout and "Serving Benchmark Result" not in done.stdout  # two levels
    assert "concurrency 4: 4/4 requests (0 failed)" in done.stderr
    report = json.loads(out.read_text())
    assert report["model"] == MODEL and report["input_len"] == 24 and report["output_len"] == 6
    assert [r["concurrency"] for r in report["results"]] == [1, 4]
    assert "completed" not in report  # two runs: each level's figures in its own row
    for level in report["results"]:
        assert level["requests_ok"] == 4 and level["requests_failed"] == 0
        assert level["prompt_tokens"] == 4 * 24  # exact-length token-id prompts
        assert level["output_tokens"] == 4 * 6  # ignore_eos: exactly output_len each
        assert level["input_len_mismatches"] == 0 and level["output_len_mismatches"] == 0
        assert level["output_tok_s"] > 0 and level["total_tok_s"] > level["output_tok_s"]
        for key in ("ttft_ms", "tpot_ms", "itl_ms"):
            stats = level[key]
            assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"]


def test_bench_serve_takes_vllms_spelling(server, tmp_path):
    # vllm bench serve's options: host and port, the model the server lists first, one level of --max-concurrency,
    # random lengths, arrivals at a request rate, chosen percentiles, and the report saved in a result folder
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    command = [sys.executable, "-m", "deltaserve.cli", "bench", "serve", "--host", host, "--port", port,
               "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "4",
               "--num-prompts", "5", "--max-concurrency", "2", "--request-rate", "40", "--ignore-eos",
               "--metric-percentiles", "25,75", "--percentile-metrics", "ttft,e2el", "--api-key", API_KEY,
               "--save-result", "--result-dir", str(tmp_path / "results" / "new"), "--disable-tqdm"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "E2EL ms p25/p75" in done.stdout and "TPOT" not in done.stdout
    assert "Serving Benchmark Result" in done.stdout and "P75 E2EL (ms):" in done.stdout
    saved = list((tmp_path / "results" / "new").glob("vllm-40qps-concurrency2-*.json"))  # the folder made, as vLLM
    assert len(saved) == 1, list(tmp_path.rglob("*"))
    report = json.loads(saved[0].read_text())
    models = httpx.get(server.base_url + "/models", headers=server.headers, timeout=10).json()["data"]
    assert report["model"] == models[0]["id"] and report["request_rate"] == 40
    (level,) = report["results"]
    assert level["concurrency"] == 2 and level["requests_ok"] == 5 and level["output_tokens"] == 5 * 4
    assert set(level["e2e_ms"]) == {"mean", "p25", "p75"} and level["e2e_ms"]["p25"] <= level["e2e_ms"]["p75"]
    # one run: its figures on top as well, under the names of vllm bench serve's result file
    assert report["completed"] == 5 and report["max_concurrency"] == 2 and report["total_output_tokens"] == 20
    assert report["p25_e2el_ms"] == level["e2e_ms"]["p25"] and report["mean_ttft_ms"] == level["ttft_ms"]["mean"]


def test_bench_serve_draws_lengths_around_a_range_after_a_shared_prefix(server, tmp_path):
    # vLLM's --random-range-ratio (here its object form) and --random-prefix-len: each request asks for the
    # lengths it drew, and the server's usage agrees with them
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "deltaserve.cli", "bench", "serve", "--base-url", server.url,
               "--random-input-len", "16", "--random-output-len", "4", "--random-prefix-len", "8",
               "--random-range-ratio", '{"input": 0.5, "output": 0.5}', "--num-prompts", "6", "--max-concurrency",
               "3", "--api-key", API_KEY, "--disable-tqdm", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["random_range_ratio"] == {"input": 0.5, "output": 0.5} and report["random_prefix_len"] == 8
    (level,) = report["results"]
    assert level["requests_ok"] == 6 and level["input_len_mismatches"] == 0 and level["output_len_mismatches"] == 0
    assert 6 * (8 + 8) <= level["prompt_tokens"] <= 6 * (8 + 24)
    assert 6 * 2 <= level["output_tokens"] <= 6 * 6


def test_bench_serve_stops_at_a_refused_warm_up(server):
    # token ids past the model's vocabulary: the server refuses the warm-up, and the run ends there, naming why
    command = [sys.executable, "-m", "deltaserve.cli", "bench", "serve", "--base-url", server.url, "--model", MODEL,
               "--max-concurrency", "2", "--num-prompts", "3", "--token-id-range", "4000000:4000010",
               "--api-key", API_KEY, "--disable-tqdm"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the warm-up request failed" in done.stderr and "HTTP 400" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "Serving Benchmark Result" not in done.stdout
