"""The OpenAI-compatible server on random weights in a real shape, driven over HTTP by
`deltaserve bench serve` in closed batches: what a client sees, set beside engine_bench.py's figures.

    python benchmarks/server_bench.py qwen3.5-9b --concurrency 32,128 --out benchmarks/results/server_SHAPE.json

The server runs in its own process (`python -m deltaserve serve DIR --load-format dummy`), the client in
this one. Each level is one closed batch: C streamed requests at once, 128-token prompts, 256 tokens
each (ignore_eos), after a warm-up batch at the same level; `output_tok_s` is every generated token over
the batch's wall time, prefill included, as engine_bench's closed_batch_tok_s, and `tpot_ms` the mean
time per token after the first, engine_bench's step. Prefix caching is off unless --prefix-caching, as
in engine_bench.

With --trace the server runs under traced_serve.py, and each measured batch also reports what the
server did meanwhile: when its requests reached their handlers and the engine, when their first
outputs reached the event loop (`admission`, in ms from the batch's start), where the engine thread's
decode steps spent their time (`engine_steps`: planning, launch, waiting for the GPU, taking in the
tokens and building the outputs) and how busy each of the server's threads was (`thread_busy`).
--switch-interval sets the server's GIL hand-over period (with --trace).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.shapes import write_shape  # noqa: E402
from deltaserve.bench import serve as client  # noqa: E402


TRACED_SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traced_serve.py")


def start_server(directory: str, port: int, max_num_seqs: int, prefix_caching: bool, log,
                 trace: str | None = None, switch_interval: float | None = None) -> subprocess.Popen:
    launcher = [TRACED_SERVE] if trace else ["-m", "deltaserve"]
    env = dict(os.environ)
    if trace:
        env["DELTASERVE_TRACE"] = trace
    if switch_interval is not None:
        env["DELTASERVE_SWITCH_INTERVAL"] = str(switch_interval)
    command = [sys.executable, *launcher, "serve", directory, "--load-format", "dummy", "--port", str(port),
               "--max-num-seqs", str(max_num_seqs), "--max-model-len", "4096", "--served-model-name", "bench",
               "--enable-prefix-caching" if prefix_caching else "--no-prefix-caching"]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def stop_server(server: subprocess.Popen, log, result: dict, out: str, tail: int = 3000) -> None:
    """Stops the server and writes `result` to `out` with the end of the server's log."""
    server.terminate()
    server.wait(timeout=60)
    log.seek(0)
    result["server_log_tail"] = log.read()[-tail:]
    results_io.write(out, result)


def wait_until_ready(server: subprocess.Popen, base_url: str, timeout_s: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before answering")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=2.0) as response:
                if response.status == 200:
                    return time.perf_counter() - started
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the server did not answer /health within {timeout_s:.0f} s")


def one_batch(base_url: str, concurrency: int, seed: int, output_len: int = 256, bench_client=client) -> dict:
    """`concurrency` requests at once, 128-token prompts, `output_len` tokens each: the client's report
    (`bench_client`: a module with bench/serve.py's run_benchmark, by default this tree's)."""
    args = argparse.Namespace(base_url=base_url, model="bench", concurrency=str(concurrency), input_len=128,
                              output_len=output_len, num_prompts=concurrency, seed=seed, api_key=None,
                              token_id_range="1000:30000", warmup=0, timeout=600.0)
    return asyncio.run(bench_client.run_benchmark(args))["results"][0]


def closed_batch(base_url: str, concurrency: int, seed: int, server_pid: int | None = None,
                 trace: str | None = None, output_len: int = 256) -> dict:
    """One warm-up batch, then the measured one (with what the trace saw of it, given a trace)."""
    one_batch(base_url, concurrency, seed + 7919, output_len)
    if trace is None:
        return one_batch(base_url, concurrency, seed, output_len)
    ticks, begin = thread_ticks(server_pid), time.perf_counter()
    row = one_batch(base_url, concurrency, seed, output_len)
    end = time.perf_counter()
    row["thread_busy"] = thread_busy(ticks, thread_ticks(server_pid), end - begin)
    time.sleep(2.5)  # the trace file is rewritten every second
    with open(trace) as f:
        recorded = json.load(f)
    row["admission"] = admission(recorded["requests"], begin, end)
    row["engine_steps"] = engine_steps(recorded["steps"], begin, end, concurrency)
    return row


def thread_ticks(pid: int) -> dict[str, int]:
    """CPU clock ticks (user + system) of each thread of a process, by 'tid:name' (Linux; the main thread's
    name is 'main')."""
    ticks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = "main" if int(tid) == pid else stat[stat.index("(") + 1:stat.rindex(")")]
        ticks[f"{tid}:{name}"] = int(fields[11]) + int(fields[12])
    return ticks


def thread_busy(before: dict, after: dict, seconds: float) -> dict[str, float]:
    """Each thread's CPU time over the wall time between the two samples, the busiest first."""
    hz = os.sysconf("SC_CLK_TCK")
    busy = {name: (after[name] - before.get(name, 0)) / hz / seconds for name in after}
    return {name: round(share, 3) for name, share in sorted(busy.items(), key=lambda kv: -kv[1]) if share >= 0.005}


def _ms(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values) * 1e3, 1), "median": round(statistics.median(values) * 1e3, 1),
            "max": round(max(values) * 1e3, 1)}


def admission(requests: dict, begin: float, end: float) -> dict:
    """The batch's requests at the server, in ms from the batch's start: handler entered, generate
    called, accepted by the engine, first output on the event loop."""
    batch = [r for r in requests.values() if r[1] is not None and begin <= r[1] <= end and None not in r]
    if not batch:
        return {}
    return {"requests": len(batch), **{name: _ms([r[i] - begin for r in batch]) for i, name in
                                       enumerate(("handler", "generate", "accepted", "first_output"))}}


def engine_steps(steps: list, begin: float, end: float, rows: int) -> dict:
    """Medians (ms) of the phases of the batch's decode steps with all `rows` requests running."""
    full = [s for s in steps if begin <= s[0] and s[5] <= end and s[6] >= rows]
    if len(full) < 3:
        return {}
    median = lambda values: round(statistics.median(values) * 1e3, 3)  # noqa: E731
    return {"steps": len(full),
            "period": median([b[0] - a[0] for a, b in zip(full, full[1:])]),
            "plan": median([s[1] - s[0] for s in full]),
            "launch": median([s[2] - s[1] for s in full]),
            "wait_for_gpu": median([s[4] - s[3] for s in full]),
            "tokens_and_outputs": median([s[5] - s[4] for s in full]),
            "between_steps": median([b[0] - a[5] for a, b in zip(full, full[1:])])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--concurrency", default="32,128")
    ap.add_argument("--prefix-caching", action="store_true")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--output-len", type=int, default=256, help="tokens generated per request")
    ap.add_argument("--trace", action="store_true", help="run the server under traced_serve.py (see above)")
    ap.add_argument("--switch-interval", type=float, default=None, help="the server's sys.setswitchinterval")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    levels = client.parse_levels(args.concurrency)
    base_url = f"http://127.0.0.1:{args.port}"
    if args.switch_interval is not None and not args.trace:
        ap.error("--switch-interval needs --trace")
    result = {**results_io.header(), "shape": args.shape, "prefix_caching": args.prefix_caching,
              "output_len": args.output_len, "switch_interval_s": args.switch_interval, "rows": []}
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_shape(args.shape, os.path.join(scratch, "model"), every_id_a_word=True)
        with open(os.path.join(scratch, "server.log"), "w+") as log:
            trace = os.path.join(scratch, "trace.json") if args.trace else None
            server = start_server(directory, args.port, max(levels), args.prefix_caching, log, trace,
                                  args.switch_interval)
            try:
                result["server_ready_s"] = round(wait_until_ready(server, base_url, 600.0), 1)
                for level in levels:
                    row = closed_batch(base_url, level, seed=level, server_pid=server.pid, trace=trace,
                                       output_len=args.output_len)
                    result["rows"].append(row)
                    results_io.write(args.out, result)
                    print(f"C={level}: {row['output_tok_s']:.1f} tok/s, tpot {row['tpot_ms']['mean']:.3f} ms, "
                          f"ttft p50 {row['ttft_ms']['p50']:.1f} ms, {row['requests_failed']} failed", flush=True)
                    if trace:
                        print(f"  admission {row['admission']}\n  engine steps {row['engine_steps']}\n"
                              f"  threads {row['thread_busy']}", flush=True)
            finally:
                stop_server(server, log, result, args.out)


if __name__ == "__main__":
    main()
