"""`deltaserve bench serve` against the live server: a complete report with zero errors."""

from __future__ import annotations

import json
import subprocess
import sys

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
    assert "TTFT ms p50/p90/p99" in done.stdout
    assert "concurrency 4: 4/4 requests (0 failed)" in done.stderr
    report = json.loads(out.read_text())
    assert report["model"] == MODEL and report["input_len"] == 24 and report["output_len"] == 6
    assert [r["concurrency"] for r in report["results"]] == [1, 4]
    for level in report["results"]:
        assert level["requests_ok"] == 4 and level["requests_failed"] == 0
        assert level["prompt_tokens"] == 4 * 24  # exact-length token-id prompts
        assert level["output_tokens"] == 4 * 6  # ignore_eos: exactly output_len each
        assert level["input_len_mismatches"] == 0 and level["output_len_mismatches"] == 0
        assert level["output_tok_s"] > 0 and level["total_tok_s"] > level["output_tok_s"]
        for key in ("ttft_ms", "tpot_ms", "itl_ms"):
            stats = level[key]
            assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"]
