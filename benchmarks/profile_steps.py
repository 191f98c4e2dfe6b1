"""Where a step's time goes, on one GPU, random weights in a real shape.

    python benchmarks/profile_steps.py qwen3.5-35b-a3b --out benchmarks/results/profile_SHAPE.json

1. Every engine step of a prefix-cache follow-up turn (the scenario of prefix_cache_bench.py), warm
   and cold: the chunks it ran and its wall time; then the CUDA kernels of each turn, by total time.
2. Decode at a few concurrencies: the engine's wall time per step against the replay of the step's
   CUDA graph alone (what the host adds), and what the GPU does and waits for between two steps'
   graphs in the engine's own loop (step_gaps).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.prefix_cache_bench import _warm_up, prefill  # noqa: E402
from benchmarks.replay_events import replay_events  # noqa: E402
from benchmarks.shapes import dummy_engine, random_tokens  # noqa: E402
from deltaserve.engine.llm_engine import LLMEngine  # noqa: E402
from deltaserve.runner.launched_step import LaunchedStep  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402


class StepLog:
    """Wraps the runner's execute: the chunks of each step and its wall time (synchronised)."""

    def __init__(self, engine: LLMEngine):
        self.steps: list[dict] = []
        runner = engine.runner
        inner = runner.execute

        def execute(plan):
            torch.cuda.synchronize()
            start = time.perf_counter()
            result = inner(plan)
            torch.cuda.synchronize()
            self.steps.append({"chunks": [(c.start, c.num_tokens) for c in plan.chunks][:4], "decode": plan.is_decode,
                               "captures": len(plan.captures), "restores": len(plan.restores),
                               "ms": round((time.perf_counter() - start) * 1e3, 2)})
            return result

        runner.execute = execute

    def take(self) -> list[dict]:
        steps, self.steps = self.steps, []
        return steps


def kernel_table(fn, rows: int = 18) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events if e.device_type.name == "CUDA")
    table = [{"name": e.key[:90], "calls": e.count, "ms": round(e.device_time_total / 1e3, 3)}
             for e in events if e.device_type.name == "CUDA"][:rows]
    host = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:rows]
    host_table = [{"name": "HOST: " + e.key[:84], "calls": e.count, "ms": round(e.self_cpu_time_total / 1e3, 3)}
                  for e in host]
    return [{"name": "ALL KERNELS", "calls": sum(e.count for e in events if e.device_type.name == "CUDA"),
             "ms": round(total / 1e3, 3)}] + table + host_table


def follow_up(engine: LLMEngine, log: StepLog, tokens, history_len: int, rows: int) -> dict:
    history = tokens(history_len)
    _, (turn1,) = prefill(engine, [history], 64)
    follow = history + turn1.outputs[0].token_ids + tokens(64)
    log.take()
    warm_s, _ = prefill(engine, [follow])
    warm_steps = log.take()
    engine.reset_prefix_cache()
    cold_s, _ = prefill(engine, [follow])
    cold_steps = log.take()
    out = {"warm_s": round(warm_s, 4), "warm_steps": warm_steps, "cold_s": round(cold_s, 4), "cold_steps": cold_steps}
    # The same two turns under the profiler (the cache now holds the cold run's blocks and snapshots).
    engine.reset_prefix_cache()
    _, (turn1,) = prefill(engine, [history], 64)
    out["warm_kernels"] = kernel_table(lambda: prefill(engine, [follow]), rows)
    engine.reset_prefix_cache()
    out["cold_kernels"] = kernel_table(lambda: prefill(engine, [follow]), rows)
    log.take()
    return out


class Timeline:
    """Host timestamps (ms from the request's arrival) of where a step's time goes: each wrapped call's
    start and end, without synchronising."""

    def __init__(self):
        self.start = 0.0
        self.marks: list[tuple[str, float, float]] = []
        self._undo: list = []

    def wrap(self, owner, name: str, label: str) -> None:
        inner = getattr(owner, name)
        own = vars(owner).get(name, None) if hasattr(owner, "__dict__") else None

        def timed(*args, **kwargs):
            begin = time.perf_counter()
            result = inner(*args, **kwargs)
            self.marks.append((label, begin, time.perf_counter()))
            return result
        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, own) if own is not None else delattr(owner, name))

    def restore(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def report(self) -> list[dict]:
        return [{"call": label, "from_ms": round((b - self.start) * 1e3, 3), "to_ms": round((e - self.start) * 1e3, 3)}
                for label, b, e in self.marks]


def warm_timeline(engine: LLMEngine, tokens, history_len: int) -> dict:
    """The warm follow-up turn once more, its host calls on a timeline."""
    import deltaserve.runner.model_runner as model_runner

    history = tokens(history_len)
    engine.reset_prefix_cache()
    _, (turn1,) = prefill(engine, [history], 64)
    follow = history + turn1.outputs[0].token_ids + tokens(64)
    line = Timeline()
    runner, scheduler = engine.runner, engine.scheduler
    line.wrap(engine, "add_request", "add_request")
    line.wrap(engine, "step", "engine.step")
    line.wrap(scheduler, "schedule", "scheduler.schedule")
    line.wrap(scheduler.prefix_cache, "lookup", "prefix_cache.lookup")
    line.wrap(runner, "execute", "runner.execute")
    line.wrap(runner, "_prepare_states", "runner._prepare_states (restores)")
    line.wrap(model_runner, "build_host_batch", "build_host_batch")
    graphs = runner.prefill_graphs
    if graphs is not None:
        line.wrap(graphs.buffers, "load_prefill", "buffers.load_prefill")
        for size, graph in graphs.graphs.items():
            line.wrap(graph, "replay", f"graph.replay (rung {size})")
    line.wrap(runner, "sampler", "sampler (reads the token back)")
    line.wrap(runner, "_save_snapshots", "runner._save_snapshots")
    line.wrap(scheduler, "step_done", "scheduler.step_done")
    line.wrap(scheduler, "finish", "scheduler.finish")
    line.wrap(engine, "_output", "engine._output")
    torch.cuda.synchronize()
    line.start = time.perf_counter()
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, detokenize=False)
    engine.add_request(f"timeline-{time.monotonic_ns()}", follow, params)
    while engine.has_unfinished_requests():
        engine.step()
    total_ms = (time.perf_counter() - line.start) * 1e3
    line.restore()
    return {"total_ms": round(total_ms, 3), "calls": line.report()}


def decode_overhead(engine: LLMEngine, tokens, concurrency: int, steps: int = 48) -> dict:
    # Room for the timed steps, the graph timing and the profiled ones: no request finishes before.
    params = SamplingParams(max_tokens=2 * steps + 32, temperature=0, ignore_eos=True, detokenize=False)
    for i in range(concurrency):
        engine.add_request(f"d{concurrency}-{i}-{time.monotonic_ns()}", tokens(128), params)
    engine.step()
    for _ in range(4):
        engine.step(final_only=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step(final_only=True)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    graphs = engine.runner.graphs
    graph = graphs.graphs[graphs.rung(concurrency)]
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay_ms = begin.elapsed_time(end) / steps
    in_engine = graph_times_in_engine(engine, graph, steps)
    kernels = kernel_table(lambda: [graph.replay() for _ in range(10)], rows=30)
    gaps = step_gaps(engine, graph, steps=10)
    while engine.has_unfinished_requests():
        engine.step(final_only=True)
    return {"concurrency": concurrency, "step_wall_ms": round(wall_ms, 3), "graph_replay_ms": round(replay_ms, 3),
            "host_ms": round(wall_ms - replay_ms, 3), **in_engine, "kernels_of_10_replays": kernels,
            "step_gaps": gaps}


def graph_times_in_engine(engine: LLMEngine, graph, steps: int) -> dict:
    """Events recorded on the stream just before and after each replay of `graph` in the engine's own
    loop: the graph's GPU time there, and the GPU time from one graph's end to the next one's start."""
    with replay_events(graph) as (marks, _):
        line = Timeline()
        line.wrap(engine.scheduler, "schedule", "schedule")
        line.wrap(engine.runner, "launch", "runner.launch")
        line.wrap(graph, "replay", "graph.replay")
        line.wrap(LaunchedStep, "token_ids", "wait for the tokens")
        line.wrap(engine, "_finish_step", "finish_step")
        try:
            line.start = time.perf_counter()
            for _ in range(steps):
                engine.step(final_only=True)
            host_ms = (time.perf_counter() - line.start) * 1e3 / steps
            torch.cuda.synchronize()
        finally:
            line.restore()
    inside = [b.elapsed_time(e) for b, e in marks]
    between = [e.elapsed_time(b) for (_, e), (b, _) in zip(marks, marks[1:])]
    host = {}
    for call in line.report():
        host[call["call"]] = host.get(call["call"], 0.0) + (call["to_ms"] - call["from_ms"]) / steps
    return {"graph_in_engine_ms": round(sum(inside) / len(inside), 3),
            "between_graphs_ms": round(sum(between) / len(between), 3),
            "host_ms_per_step": {"engine.step": round(host_ms, 3), **{k: round(v, 3) for k, v in host.items()}}}


def step_gaps(engine: LLMEngine, graph, steps: int) -> dict:
    """GPU activity (kernels and copies) of `steps` engine steps, each kernel's start and end from the
    profiler: the graph's kernels are those whose names a replay of the graph alone runs; the rest ran
    between graphs. Idle time is the span minus the union of all activity, split by what came before
    and after each idle stretch."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    in_graph = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step(final_only=True)
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    outside: dict[str, list[float]] = {}
    idle: dict[str, list[float]] = {}
    reach, before = spans[0][0], None
    for start, end, name in spans:
        label = "graph" if name in in_graph else name[:70]
        if label != "graph":
            outside.setdefault(label, [0, 0.0])
            outside[label][0] += 1
            outside[label][1] += end - start
        if start > reach and before is not None:
            key = f"{before} -> {label}"
            idle.setdefault(key, [0, 0.0])
            idle[key][0] += 1
            idle[key][1] += start - reach
        if end >= reach:
            reach, before = end, label
    span_us = reach - spans[0][0]
    rows = lambda table: [{"what": k, "count": n, "us_per_step": round(us / steps, 1)}  # noqa: E731
                          for k, (n, us) in sorted(table.items(), key=lambda kv: -kv[1][1])][:12]
    return {"steps": steps, "span_ms_per_step": round(span_us / steps / 1e3, 3),
            "idle_ms_per_step": round(sum(us for _, us in idle.values()) / steps / 1e3, 3),
            "outside_graph_ms_per_step": round(sum(us for _, us in outside.values()) / steps / 1e3, 3),
            "outside_graph": rows(outside), "idle_between": rows(idle)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", default="qwen3.5-35b-a3b")
    ap.add_argument("--history", type=int, default=8192)
    ap.add_argument("--concurrency", default="1,8,64,128", help="decode batch sizes; empty: no decode")
    ap.add_argument("--rows", type=int, default=18, help="rows of each kernel table")
    ap.add_argument("--no-prefix", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    engine = dummy_engine(args.shape, max_num_seqs=128, max_model_len=16384, max_num_batched_tokens=8192)
    tokens = random_tokens(engine.model_config.vocab_size)
    result = {**results_io.header(), "shape": args.shape}
    log = StepLog(engine)
    if not args.no_prefix:
        _warm_up(engine, tokens, args.history)
        log.take()
        # The timeline first: once the profiler has run, CUPTI stays attached and slows every launch.
        result["warm_timelines"] = [warm_timeline(engine, tokens, args.history) for _ in range(3)]
        for line in result["warm_timelines"]:
            print(line, flush=True)
        result["follow_up"] = follow_up(engine, log, tokens, args.history, args.rows)
        print({k: v for k, v in result["follow_up"].items() if "kernels" not in k}, flush=True)
        for key in ("warm_kernels", "cold_kernels"):
            print(key)
            for row in result["follow_up"][key]:
                print(f"  {row['ms']:9.3f} ms {row['calls']:6d}  {row['name']}")
        results_io.write(args.out, result)
    engine.reset_prefix_cache()
    result["decode"] = []
    for c in (int(c) for c in args.concurrency.split(",") if c):
        decode_overhead(engine, tokens, c, steps=8)  # warm-up
        log.take()
        result["decode"].append(decode_overhead(engine, tokens, c))
        log.take()
        print({k: v for k, v in result["decode"][-1].items() if k not in ("kernels_of_10_replays", "step_gaps")},
              flush=True)
        gaps = result["decode"][-1]["step_gaps"]
        print({k: v for k, v in gaps.items() if not isinstance(v, list)})
        for row in gaps["outside_graph"] + gaps["idle_between"]:
            print(f"  {row['us_per_step']:8.1f} us/step {row['count']:5d}  {row['what']}")
        for row in result["decode"][-1]["kernels_of_10_replays"]:
            if not row["name"].startswith("HOST"):
                print(f"  {row['ms']:9.3f} ms {row['calls']:6d}  {row['name']}")
    results_io.write(args.out, result)


if __name__ == "__main__":
    main()
