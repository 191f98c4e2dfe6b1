"""`deltaserve bench serve`: drive an OpenAI-compatible server with token-id prompts of known lengths.

Each request sends `input_len` random token ids to /v1/completions and asks for exactly
`output_len` tokens (`ignore_eos`), streamed, so time to first token, the gaps between
streamed chunks and the time per output token can be measured. With a range ratio the lengths
are drawn around those, and with a prefix length every prompt of a level opens with the same
ids, as in vLLM's random dataset (`workload.py`). Every concurrency level gets
its own prompts, so the server's prefix cache cannot serve one level from another. Each of a
level's connections is kept alive across requests and levels (`http_stream.py`); a request
waits for a free one, so a level's concurrency is its number of connections. Requests go out
all at once, or at `--request-rate` a second in gamma-distributed gaps (Poisson arrivals at
`--burstiness` 1), as vLLM's client sends them. The command also reads `vllm bench serve`'s
spelling of its options (`--max-concurrency`, `--random-input-len`, `--host`/`--port`,
`--save-result`, ...) where they mean what they mean there.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import random
import sys
import time
import urllib.request
from typing import Any

from deltaserve.bench.http_stream import Connection, HTTPStreamError, sse_data
from deltaserve.bench.report import format_table, format_vllm_summary
from deltaserve.bench.stats import RequestResult, summarize, vllm_fields
from deltaserve.bench.workload import BenchRequest, WorkloadError, check_workload, make_requests, parse_range_ratio
from deltaserve.errors import DeltaServeError


class BenchArgumentError(DeltaServeError, ValueError):
    """An argument of `deltaserve bench serve` that the client cannot use."""


class WarmUpFailedError(DeltaServeError):
    """The server refused a warm-up request: every measured request would fail the same way."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine; "
                   "default: http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1", help="the server's host, where --base-url is not given")
    p.add_argument("--port", type=int, default=8000, help="the server's port, where --base-url is not given")
    p.add_argument("--model", default=None, help="model name the server knows (default: the first it lists)")
    p.add_argument("--concurrency", default=None, help="comma-separated levels (default: 1,2,4,8,16,32,64)")
    p.add_argument("--max-concurrency", type=int, default=None, help="vLLM's: one level of this concurrency")
    p.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=128,
                   help="prompt tokens per request")
    p.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=256,
                   help="generated tokens per request")
    p.add_argument("--num-prompts", type=int, default=64, help="requests per concurrency level")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests a second, sent in gamma-distributed gaps (default: inf, all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="the gaps' gamma shape: 1 is a Poisson process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON report here (else it is printed)")
    p.add_argument("--save-result", action="store_true", help="vLLM's: write the JSON report to --result-dir")
    p.add_argument("--result-dir", default=".", help="with --save-result: the folder")
    p.add_argument("--result-filename", default=None, help="with --save-result: the file's name (default: from the "
                   "backend, rate, concurrency, model and time)")
    p.add_argument("--metric-percentiles", default="50,90,99", help="comma-separated percentiles reported")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="the distributions the table shows, of ttft, tpot, itl and e2el (the report has all)")
    p.add_argument("--api-key", default=None, help="bearer key (env: OPENAI_API_KEY)")
    p.add_argument("--token-id-range", default="1000:30000",
                   help="prompt token ids are drawn uniformly from LOW:HIGH (inside every common vocabulary)")
    p.add_argument("--warmup", type=int, default=1, help="uncounted requests sent first")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    # vLLM's options that hold here by construction, or name what this client does not do
    p.add_argument("--dataset-name", default="random", help="random only: prompts of random token ids")
    p.add_argument("--random-range-ratio", default="0", help="vLLM's: lengths drawn from [L (1 - r), L (1 + r)], r "
                   "in [0, 1); a number for both or a JSON object {\"input\": r1, \"output\": r2}")
    p.add_argument("--random-prefix-len", type=int, default=0,
                   help="vLLM's: random token ids that every prompt of a level opens with, before its own")
    p.add_argument("--backend", default="vllm", help="vllm or openai: both mean /v1/completions")
    p.add_argument("--endpoint", default="/v1/completions", help="/v1/completions only")
    p.add_argument("--ignore-eos", action="store_true", help="accepted: every request ignores end of sequence")
    p.add_argument("--tokenizer", default=None, help="accepted: the prompts are token ids, so none is needed")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress line on stderr")


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """args over the command's defaults: a caller that builds its own Namespace names only what it sets."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return argparse.Namespace(**{**vars(parser.parse_args([])), **vars(args)})


def check_arguments(args: argparse.Namespace) -> None:
    """What this client cannot do, named before it sends anything."""
    if args.dataset_name != "random":
        raise BenchArgumentError(f"--dataset-name {args.dataset_name}: only random token-id prompts are sent here")
    try:
        check_workload(args.input_len, args.output_len, parse_range_ratio(args.random_range_ratio),
                       args.random_prefix_len)
    except WorkloadError as exc:
        raise BenchArgumentError(str(exc)) from None
    if args.backend not in ("vllm", "openai"):
        raise BenchArgumentError(f"--backend {args.backend}: vllm or openai (the completions API)")
    if args.endpoint.rstrip("/") not in ("/v1/completions", "/completions"):
        raise BenchArgumentError(f"--endpoint {args.endpoint}: only /v1/completions is driven here")
    if args.concurrency is not None and args.max_concurrency is not None:
        raise BenchArgumentError("--concurrency and --max-concurrency: give one of them")
    if not args.request_rate > 0 or not 0 < args.burstiness < math.inf:
        raise BenchArgumentError("--request-rate and --burstiness must be positive (the burstiness finite)")
    if args.num_prompts < 1 or args.warmup < 0 or not args.timeout > 0:
        raise BenchArgumentError("--num-prompts must be at least 1, --warmup at least 0 and --timeout positive")
    token_id_range(args)
    concurrency_levels(args)
    parse_percentiles(args.metric_percentiles)
    table_metrics(args)


def token_id_range(args: argparse.Namespace) -> tuple[int, int]:
    """--token-id-range's LOW:HIGH, the ids a prompt draws from (HIGH excluded)."""
    try:
        low, high = (int(x) for x in args.token_id_range.split(":"))
    except ValueError:
        low = high = -1
    if not 0 <= low < high:
        raise BenchArgumentError(f"--token-id-range {args.token_id_range!r}: LOW:HIGH, two ids with 0 <= LOW < HIGH")
    return low, high


def concurrency_levels(args: argparse.Namespace) -> list[int]:
    if args.max_concurrency is not None:
        return parse_levels(str(args.max_concurrency))
    return parse_levels(args.concurrency or "1,2,4,8,16,32,64")


def base_url(args: argparse.Namespace) -> str:
    return args.base_url or f"http://{args.host}:{args.port}"


def table_metrics(args: argparse.Namespace) -> list[str]:
    """vLLM's names of the distributions the table shows."""
    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    if not metrics or set(metrics) - {"ttft", "tpot", "itl", "e2el"}:
        raise BenchArgumentError(f"--percentile-metrics {args.percentile_metrics!r}: name some of ttft, tpot, itl "
                                 "and e2el")
    return metrics


def _comma_separated(text: str, cast) -> list:
    """The values of a comma-separated list ([] where one is not a number)."""
    try:
        return [cast(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return []


def parse_percentiles(text: str) -> list[float]:
    values = _comma_separated(text, float)
    if not values or any(not 0 <= v <= 100 for v in values):
        raise BenchArgumentError(f"--metric-percentiles needs numbers from 0 to 100, got {text!r}")
    return values


def parse_levels(text: str) -> list[int]:
    levels = _comma_separated(text, int)
    if not levels or any(level < 1 for level in levels):
        raise BenchArgumentError(f"--concurrency needs positive integers, got {text!r}")
    return levels


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
    result = RequestResult(ok=False, prompt_tokens=len(prompt), sent_prompt_tokens=len(prompt),
                           asked_output_tokens=output_len)
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
            if choices:  # a token's chunk, as vLLM's client reads it: its text may be empty (a special token)
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
    result.latency = last - start  # to the last token's chunk, as vLLM's: not the usage chunk or [DONE] after it
    if not result.output_tokens:
        result.output_tokens = chunks  # a server that sends no usage: one token per chunk
    result.ok = result.ttft is not None
    if not result.ok:
        result.error = "the stream carried no tokens"
    return result


class _Progress:
    def __init__(self, concurrency: int, total: int, shown: bool = True):
        self.concurrency = concurrency
        self.total = total
        self.shown = shown
        self.done = 0
        self.failed = 0
        self.start = time.perf_counter()

    def update(self, result: RequestResult) -> None:
        self.done += 1
        self.failed += 0 if result.ok else 1
        if not self.shown:
            return
        elapsed = time.perf_counter() - self.start
        end = "\n" if self.done == self.total else ""
        sys.stderr.write(f"\rconcurrency {self.concurrency}: {self.done}/{self.total} requests"
                         f" ({self.failed} failed), {elapsed:.1f}s{end}")
        sys.stderr.flush()


def arrival_gaps(n: int, request_rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Seconds to wait before each of n requests: none at an infinite rate, else gamma-distributed gaps of mean
    1 / request_rate (shape `burstiness`; 1 is a Poisson process), as vLLM's client draws them."""
    if math.isinf(request_rate):
        return [0.0] * n
    return [rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness)) for _ in range(n)]


async def run_level(connections: list[Connection], model: str, requests: list[BenchRequest], concurrency: int,
                    headers: dict[str, str], gaps: list[float] | None = None,
                    progress: bool = True) -> tuple[list[RequestResult], float]:
    """The requests over `concurrency` connections, in order: each is sent after its gap (none by default) and
    waits for a free connection."""
    free: asyncio.Queue[Connection] = asyncio.Queue()
    for conn in connections[:min(concurrency, len(requests))]:
        free.put_nowait(conn)
    results: list[RequestResult | None] = [None] * len(requests)
    shown = _Progress(concurrency, len(requests), progress)

    async def send(k: int, request: BenchRequest) -> None:
        conn = await free.get()
        try:
            results[k] = await send_request(conn, model, request.prompt, request.output_len, headers)
        finally:
            free.put_nowait(conn)
        shown.update(results[k])

    start = time.perf_counter()
    sending = []
    for k, request in enumerate(requests):
        if gaps and gaps[k] > 0:
            await asyncio.sleep(gaps[k])
        sending.append(asyncio.create_task(send(k, request)))
    await asyncio.gather(*sending)
    return [r for r in results if r is not None], time.perf_counter() - start


def first_model(base_url: str, headers: dict[str, str], timeout: float) -> str:
    """The first model the server lists (vLLM's client does the same where --model is not given)."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/v1/models"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as answer:
            models = json.load(answer).get("data") or []
    except (OSError, ValueError) as exc:
        raise BenchArgumentError(f"--model not given, and {url} did not list the served models: {exc}") from None
    if not models:
        raise BenchArgumentError(f"--model not given, and {url} lists no model")
    return models[0]["id"]


async def run_benchmark(args: argparse.Namespace) -> dict:
    args = with_defaults(args)
    check_arguments(args)
    levels = concurrency_levels(args)
    percentiles = parse_percentiles(args.metric_percentiles)
    ratios = parse_range_ratio(args.random_range_ratio)
    low, high = token_id_range(args)
    url = completions_url(base_url(args))
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    if args.model is None:
        args.model = await asyncio.to_thread(first_model, base_url(args), headers, args.timeout)
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "base_url": base_url(args),
        "model": args.model,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "random_range_ratio": {"input": ratios[0], "output": ratios[1]},
        "random_prefix_len": args.random_prefix_len,
        "num_prompts": args.num_prompts,
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
        "burstiness": args.burstiness,
        "percentiles": percentiles,
        "seed": args.seed,
        "command": " ".join(["deltaserve", *sys.argv[1:]]),
        "results": [],
    }
    try:
        connections = [Connection(url, args.timeout) for _ in range(max(levels))]  # kept alive across levels
    except ValueError as exc:
        raise BenchArgumentError(f"--base-url: {exc}") from None
    try:
        draw = lambda n, seed: make_requests(n, args.input_len, args.output_len, ratios,  # noqa: E731
                                             args.random_prefix_len, low, high, seed)
        for k in range(args.warmup):
            warm = draw(1, args.seed * 1_000_003 + 999_983 + k)[0]
            result = await send_request(connections[0], args.model, warm.prompt, min(warm.output_len, 8), headers)
            if not result.ok:  # vLLM's client stops at its initial test run's failure too
                raise WarmUpFailedError(f"the warm-up request failed, so the run stops before it is measured (check "
                                        f"--model, --token-id-range and the lengths against the server): "
                                        f"{result.error}")
        for level in levels:
            requests = draw(args.num_prompts, args.seed * 1_000_003 + level)  # a level's own prefix and prompts
            gaps = arrival_gaps(len(requests), args.request_rate, args.burstiness, random.Random(args.seed + level))
            results, duration = await run_level(connections, args.model, requests, level, headers, gaps,
                                                progress=not args.disable_tqdm)
            report["results"].append(summarize(level, results, duration, args.output_len, args.input_len,
                                               percentiles))
        if len(report["results"]) == 1:  # one run, as vllm bench serve's result file holds it: its figures on top
            names = vllm_fields([], 1.0, percentiles)
            report.update({key: report["results"][0][key] for key in names}, backend=args.backend,
                          model_id=report["model"], max_concurrency=levels[0])
    finally:
        for conn in connections:
            conn.close()
    return report


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    report = asyncio.run(run_benchmark(args))
    print(format_table(report, table_metrics(args)))
    if len(report["results"]) == 1:
        print(format_vllm_summary(report["results"][0], table_metrics(args), report["percentiles"],
                                  max_concurrency=report["max_concurrency"],
                                  request_rate=None if math.isinf(args.request_rate) else args.request_rate))
    text = json.dumps(report, indent=2)
    paths = [args.out] if args.out else []
    if args.save_result:
        paths.append(os.path.join(args.result_dir, args.result_filename or default_result_name(args, report)))
    for path in paths:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # vLLM's client makes --result-dir too
        with open(path, "w") as f:
            f.write(text + "\n")
        print(f"report written to {path}")
    if not paths:
        print(text)
    failed = sum(r["requests_failed"] for r in report["results"])
    return 1 if failed else 0


def default_result_name(args: argparse.Namespace, report: dict) -> str:
    """vLLM's: backend, rate, concurrency, model and time."""
    rate = "inf" if math.isinf(args.request_rate) else f"{args.request_rate:g}"
    levels = "_".join(str(r["concurrency"]) for r in report["results"])
    model = report["model"].rstrip("/").split("/")[-1]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{args.backend}-{rate}qps-concurrency{levels}-{model}-{stamp}.json"
