"""`deltaserve bench serve`: drive an OpenAI-compatible server with exact-length token prompts.

Each request sends `input_len` random token ids to /v1/completions and asks for exactly
`output_len` tokens (`ignore_eos`), streamed, so time to first token, the gaps between
streamed chunks and the time per output token can be measured. Every concurrency level gets
its own prompts, so the server's prefix cache cannot serve one level from another. Each worker
keeps one HTTP/1.1 connection alive across requests and levels (`http_stream.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import sys
import time
from typing import Any

from deltaserve.bench.http_stream import Connection, HTTPStreamError, sse_data
from deltaserve.bench.report import format_table
from deltaserve.bench.stats import RequestResult, summarize
from deltaserve.errors import DeltaServeError


class BenchArgumentError(DeltaServeError, ValueError):
    """An argument of `deltaserve bench serve` that the client cannot use."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
    p.add_argument("--model", required=True, help="model name the server knows")
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="comma-separated levels")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=256, help="generated tokens per request")
    p.add_argument("--num-prompts", type=int, default=64, help="requests per concurrency level")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON report here (else it is printed)")
    p.add_argument("--api-key", default=None, help="bearer key (env: OPENAI_API_KEY)")
    p.add_argument("--token-id-range", default="1000:30000",
                   help="prompt token ids are drawn uniformly from LOW:HIGH (inside every common vocabulary)")
    p.add_argument("--warmup", type=int, default=1, help="uncounted requests sent first")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or any(level < 1 for level in levels):
        raise BenchArgumentError(f"--concurrency needs positive integers, got {text!r}")
    return levels


def make_prompts(n: int, input_len: int, low: int, high: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(input_len)] for _ in range(n)]


def completions_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/completions"


async def send_request(conn: Connection, model: str, prompt: list[int], output_len: int,
                       headers: dict[str, str]) -> RequestResult:
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body = json.dumps(payload).encode()
    start = time.perf_counter()
    result = RequestResult(ok=False, prompt_tokens=len(prompt))
    chunks = 0
    last = start
    try:
        status, response = await conn.post(body, headers)
        if status != 200:
            text = b"".join([part async for part in response]).decode(errors="replace")
            result.error = f"HTTP {status}: {text[:200]}"
            return result
        done = False
        async for data in sse_data(response):  # read to the end, past [DONE]: the connection is kept
            if done or data == "[DONE]":
                done = True
                continue
            event = json.loads(data)
            if "error" in event:
                result.error = str(event["error"].get("message", event["error"]))[:200]
                done = True
                continue
            choices = event.get("choices") or []
            if choices and choices[0].get("text"):
                now = time.perf_counter()
                if result.ttft is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
                chunks += 1
            usage = event.get("usage")
            if usage:
                result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
                result.output_tokens = usage.get("completion_tokens", 0)
    except (HTTPStreamError, OSError, asyncio.TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
        return result
    if result.error is not None:
        return result
    result.latency = time.perf_counter() - start
    if not result.output_tokens:
        result.output_tokens = chunks  # a server that sends no usage: one token per chunk
    result.ok = result.ttft is not None
    if not result.ok:
        result.error = "the stream carried no tokens"
    return result


class _Progress:
    def __init__(self, concurrency: int, total: int):
        self.concurrency = concurrency
        self.total = total
        self.done = 0
        self.failed = 0
        self.start = time.perf_counter()

    def update(self, result: RequestResult) -> None:
        self.done += 1
        self.failed += 0 if result.ok else 1
        elapsed = time.perf_counter() - self.start
        end = "\n" if self.done == self.total else ""
        sys.stderr.write(f"\rconcurrency {self.concurrency}: {self.done}/{self.total} requests"
                         f" ({self.failed} failed), {elapsed:.1f}s{end}")
        sys.stderr.flush()


async def run_level(connections: list[Connection], model: str, prompts: list[list[int]], output_len: int,
                    concurrency: int, headers: dict[str, str]) -> tuple[list[RequestResult], float]:
    """The prompts through `concurrency` workers, each on its own connection."""
    pending = list(enumerate(prompts))
    results: list[RequestResult | None] = [None] * len(prompts)
    progress = _Progress(concurrency, len(prompts))

    async def worker(conn: Connection) -> None:
        while pending:
            k, prompt = pending.pop(0)
            results[k] = await send_request(conn, model, prompt, output_len, headers)
            progress.update(results[k])

    start = time.perf_counter()
    await asyncio.gather(*(worker(conn) for conn in connections[:min(concurrency, len(prompts))]))
    return [r for r in results if r is not None], time.perf_counter() - start


async def run_benchmark(args: argparse.Namespace) -> dict:
    levels = parse_levels(args.concurrency)
    low, high = (int(x) for x in args.token_id_range.split(":"))
    url = completions_url(args.base_url)
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "base_url": args.base_url,
        "model": args.model,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_prompts": args.num_prompts,
        "seed": args.seed,
        "command": " ".join(["deltaserve", *sys.argv[1:]]),
        "results": [],
    }
    try:
        connections = [Connection(url, args.timeout) for _ in range(max(levels))]  # kept alive across levels
    except ValueError as exc:
        raise BenchArgumentError(f"--base-url: {exc}") from None
    try:
        for k in range(args.warmup):
            warm = make_prompts(1, args.input_len, low, high, seed=args.seed * 1_000_003 + 999_983 + k)[0]
            await send_request(connections[0], args.model, warm, min(args.output_len, 8), headers)
        for level in levels:
            prompts = make_prompts(args.num_prompts, args.input_len, low, high, seed=args.seed * 1_000_003 + level)
            results, duration = await run_level(connections, args.model, prompts, args.output_len, level, headers)
            report["results"].append(summarize(level, results, duration, args.output_len, args.input_len))
    finally:
        for conn in connections:
            conn.close()
    return report


def run(args: argparse.Namespace) -> int:
    report = asyncio.run(run_benchmark(args))
    print(format_table(report))
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(f"report written to {args.out}")
    else:
        print(text)
    failed = sum(r["requests_failed"] for r in report["results"])
    return 1 if failed else 0
