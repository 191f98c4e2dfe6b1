"""The OpenAI-compatible server on random weights in a real shape, driven over HTTP by
`deltaserve bench serve` in closed batches: what a client sees, set beside engine_bench.py's figures.

    python benchmarks/server_bench.py qwen3.5-9b --concurrency 32,128 --out benchmarks/results/server_SHAPE.json

The server runs in its own process (`python -m deltaserve serve DIR --load-format dummy`), the client in
this one. Each level is one closed batch: C streamed requests at once, 128-token prompts, 256 tokens
each (ignore_eos), after a warm-up batch at the same level; `output_tok_s` is every generated token over
the batch's wall time, prefill included, as engine_bench's closed_batch_tok_s, and `tpot_ms` the mean
time per token after the first, engine_bench's step. Prefix caching is off unless --prefix-caching, as
in engine_bench.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.shapes import write_shape  # noqa: E402
from deltaserve.bench import serve as client  # noqa: E402


def start_server(directory: str, port: int, max_num_seqs: int, prefix_caching: bool, log) -> subprocess.Popen:
    command = [sys.executable, "-m", "deltaserve", "serve", directory, "--load-format", "dummy", "--port", str(port),
               "--max-num-seqs", str(max_num_seqs), "--max-model-len", "4096", "--served-model-name", "bench",
               "--enable-prefix-caching" if prefix_caching else "--no-prefix-caching"]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def wait_until_ready(server: subprocess.Popen, base_url: str, timeout_s: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before answering")
        try:
            if httpx.get(base_url + "/health", timeout=2.0).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the server did not answer /health within {timeout_s:.0f} s")


def one_batch(base_url: str, concurrency: int, seed: int) -> dict:
    """`concurrency` requests at once, 128-token prompts, 256 tokens each: the client's report of them."""
    args = argparse.Namespace(base_url=base_url, model="bench", concurrency=str(concurrency), input_len=128,
                              output_len=256, num_prompts=concurrency, seed=seed, api_key=None,
                              token_id_range="1000:30000", warmup=0, timeout=600.0)
    return asyncio.run(client.run_benchmark(args))["results"][0]


def closed_batch(base_url: str, concurrency: int, seed: int) -> dict:
    """One warm-up batch, then the measured one."""
    one_batch(base_url, concurrency, seed + 7919)
    return one_batch(base_url, concurrency, seed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--concurrency", default="32,128")
    ap.add_argument("--prefix-caching", action="store_true")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    levels = client.parse_levels(args.concurrency)
    base_url = f"http://127.0.0.1:{args.port}"
    result = {**results_io.header(), "shape": args.shape, "prefix_caching": args.prefix_caching, "rows": []}
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_shape(args.shape, os.path.join(scratch, "model"), every_id_a_word=True)
        with open(os.path.join(scratch, "server.log"), "w+") as log:
            server = start_server(directory, args.port, max(levels), args.prefix_caching, log)
            try:
                result["server_ready_s"] = round(wait_until_ready(server, base_url, 600.0), 1)
                for level in levels:
                    row = closed_batch(base_url, level, seed=level)
                    result["rows"].append(row)
                    results_io.write(args.out, result)
                    print(f"C={level}: {row['output_tok_s']:.1f} tok/s, tpot {row['tpot_ms']['mean']:.3f} ms, "
                          f"ttft p50 {row['ttft_ms']['p50']:.1f} ms, {row['requests_failed']} failed", flush=True)
            finally:
                server.terminate()
                server.wait(timeout=60)
                log.seek(0)
                result["server_log_tail"] = log.read()[-3000:]
                results_io.write(args.out, result)


if __name__ == "__main__":
    main()
