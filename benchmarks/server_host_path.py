"""The server's host path alone: the OpenAI server over an engine whose step only waits, as a GPU does.

    python benchmarks/server_host_path.py --step-ms 9.4 --concurrency 32,128 --out benchmarks/results/server_host_path.json

No model and no GPU: `WaitingEngine.step` waits without the GIL until `--step-ms` has passed since
its previous step (as the real engine waits for a step's tokens while the next one runs), spins in
Python for the engine's own host work (`--host-ms` plus `--host-us-per-row` per running request:
planning, batch building, launch; the defaults fit the shortest host steps graph_gaps.py measured on
the 9B shape, 1.34 ms at 32 rows and 2.65 at 128), then does the output work of `LLMEngine` for every
running request (a token, the incremental detokenizer, a cumulative RequestOutput). The server's
event loop (SSE chunks, HTTP writes) and the engine thread share one interpreter, so whatever the
loop holds the GIL for can delay the engine's next step: `tpot_ms` over `--step-ms` is that delay.
`server_cpu_us_per_token` is the server process's CPU time (both threads, the modelled host work
included) over the tokens streamed, `client_cpu_us_per_token` the client's. The client (`deltaserve
bench serve`) runs in this process, the server in its own.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.server_bench import one_batch, wait_until_ready  # noqa: E402
from benchmarks.shapes import write_word_tokenizer  # noqa: E402
from deltaserve.bench import serve as client  # noqa: E402
from deltaserve.engine.detokenizer import IncrementalDetokenizer  # noqa: E402
from deltaserve.engine.llm_engine import EngineStats  # noqa: E402
from deltaserve.outputs import CompletionOutput, RequestOutput  # noqa: E402

VOCAB = 32000


class WaitingEngine:
    """Just enough of LLMEngine for AsyncEngine: requests, steps that wait `step_s`, real outputs."""

    def __init__(self, tokenizer, step_s: float, host_s: tuple[float, float]):
        self.tokenizer = tokenizer
        self.model_name = "bench"
        self.max_model_len = 4096
        self.step_s = step_s
        self.host_s = host_s  # the engine's own host work per step: fixed, per row
        self.running: dict[str, tuple] = {}
        self.rng = random.Random(0)
        self.ready_at = 0.0
        self._stats = EngineStats()

    def add_request(self, request_id, prompt, params, **_):
        self.running[request_id] = (list(prompt), params, IncrementalDetokenizer(self.tokenizer, prompt, params), [])

    def abort(self, request_id):
        self.running.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def stats(self):
        self._stats.num_running = len(self.running)
        return self._stats

    def step(self):
        # The GPU's step, overlapped with the host work as under asynchronous scheduling: the
        # wait is whatever is left of `step_s` since the previous step was launched (no GIL held).
        now = time.perf_counter()
        if now < self.ready_at:
            time.sleep(self.ready_at - now)
        self.ready_at = max(now, self.ready_at) + self.step_s
        busy_until = time.perf_counter() + self.host_s[0] + self.host_s[1] * len(self.running)
        while time.perf_counter() < busy_until:  # planning, batch building, launch: Python that holds the GIL
            pass
        outputs = []
        for request_id, (prompt, params, detok, tokens) in list(self.running.items()):
            token = self.rng.randrange(2, VOCAB)
            tokens.append(token)
            detok.append(token)
            done = len(tokens) >= params.max_tokens
            outputs.append(RequestOutput(request_id, None, prompt, [CompletionOutput(
                0, detok.visible_text(done), list(tokens), "length" if done else None)], finished=done))
            if done:
                del self.running[request_id]
        return outputs


def _found(module: str, otherwise: str) -> str:
    """What uvicorn will pick: `module` when it is installed."""
    import importlib.util

    return module if importlib.util.find_spec(module) else otherwise


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process, all its threads (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(port: int, step_ms: float, host_s: tuple[float, float], switch_interval: float | None) -> None:
    import uvicorn
    from transformers import AutoTokenizer

    from deltaserve.engine.async_engine import AsyncEngine
    from deltaserve.server.app import build_app
    from deltaserve.tokenizer import Tokenizer

    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    with tempfile.TemporaryDirectory() as directory:
        write_word_tokenizer(directory, VOCAB)
        tokenizer = Tokenizer(AutoTokenizer.from_pretrained(directory))
    engine = AsyncEngine(WaitingEngine(tokenizer, step_ms / 1e3, host_s))
    uvicorn.run(build_app(engine, ["bench"]), host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-ms", type=float, default=9.4)
    ap.add_argument("--concurrency", default="32,128")
    ap.add_argument("--host-ms", type=float, default=0.9, help="the engine's host work per step, fixed part")
    ap.add_argument("--host-us-per-row", type=float, default=13.6, help="the engine's host work per step and row")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval in the server")
    ap.add_argument("--port", type=int, default=8124)
    ap.add_argument("--out", default=None)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.port, args.step_ms, (args.host_ms / 1e3, args.host_us_per_row / 1e6), args.switch_interval)
    base_url = f"http://127.0.0.1:{args.port}"
    command = [sys.executable, __file__, "--serve", "--port", str(args.port), "--step-ms", str(args.step_ms),
               "--host-ms", str(args.host_ms), "--host-us-per-row", str(args.host_us_per_row)]
    if args.switch_interval is not None:
        command += ["--switch-interval", str(args.switch_interval)]
    result = {**results_io.header(), "cpus": os.cpu_count(), "http": _found("httptools", "h11"),
              "loop": _found("uvloop", "asyncio"), "step_ms": args.step_ms, "host_ms": args.host_ms,
              "host_us_per_row": args.host_us_per_row, "switch_interval": args.switch_interval, "rows": []}
    server = subprocess.Popen(command)
    try:
        wait_until_ready(server, base_url, 120.0)
        for level in client.parse_levels(args.concurrency):
            cpu_before, client_before = process_cpu_s(server.pid), time.process_time()
            row = one_batch(base_url, level, seed=level)
            per_token = lambda seconds: round(seconds / row["output_tokens"] * 1e6, 1)  # noqa: E731
            row["server_cpu_us_per_token"] = per_token(process_cpu_s(server.pid) - cpu_before)
            row["client_cpu_us_per_token"] = per_token(time.process_time() - client_before)
            result["rows"].append(row)
            print(f"\nC={level}: tpot {row['tpot_ms']['mean']:.3f} ms over a {args.step_ms} ms step, "
                  f"{row['output_tok_s']:.1f} tok/s, server CPU {row['server_cpu_us_per_token']} us per token, "
                  f"client CPU {row['client_cpu_us_per_token']}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    if args.out:
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
