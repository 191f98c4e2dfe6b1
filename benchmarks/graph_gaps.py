"""What a decode step costs between its CUDA graphs: the step's graph replayed alone, then with each
thing the engine's loop adds around it, one at a time, and the engine's loop itself.

    python benchmarks/graph_gaps.py qwen3.5-9b --concurrency 32,128 --out benchmarks/results/graph_gaps_SHAPE.json

In the engine the 9B shape's step at 128 rows takes 9.574 ms against 9.34 for its graph replayed back to
back (profile_qwen3.5-9b_c128_b9f4b93.json), and the profiler puts most of the difference between the
step's copy in and its graph's first kernel. Each variant below runs `--steps` steps queued without a
host wait (but `depth1` and `engine`), timed on the host's clock between two synchronisations:

- replay: the rung's graph alone; replay_two_execs: alternating with a second capture of the same rung;
- copy_in: the step's one copy in (StepBuffers' pinned mirrors, in turn), then the replay; the same with
  two graphs alternating (copy_in_two_execs), and with the copy made by a kernel that reads the pinned
  mirror in place (copy_in_by_kernel: no copy engine between the graphs);
- copy_in_out: and the tokens' copy out into one pinned buffer; copy_in_out_fresh: into a fresh pinned
  tensor with a fresh event each step, as LaunchedStep does;
- depth1: copy_in_out_fresh, the host then waiting for the step queued before this one (the engine's
  asynchronous scheduling without its bookkeeping); engine: LLMEngine.step itself, set against
  the replay timed before it and again after it (its steps lengthen the sequences); engine_gc_off:
  the same with Python's garbage collector off while it is timed.

Then the engine's steps once more, with events around each of its replays (`engine_timeline`): the GPU
time between one graph's end and the next one's start, step by step, and how many graphs the host
launched only after the graph before had already finished on the GPU (the host late), against what it
spent on each step.

The graphs replay over the buffers of the engine's last step (the same positions again): the work of a
step, not its result.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernels_check import time_eager_us  # noqa: E402
from benchmarks.replay_events import replay_events  # noqa: E402
from benchmarks.shapes import dummy_engine, random_tokens  # noqa: E402
from deltaserve.runner.cuda_graphs import capture_graph  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402


class _DeviceArray:
    """A pinned host tensor described as device memory (__cuda_array_interface__): with unified
    addressing its host address is also its device address, so torch can wrap it as a CUDA tensor that
    kernels read over the bus."""

    def __init__(self, pinned: torch.Tensor):
        assert pinned.is_pinned() and pinned.dtype == torch.int64 and pinned.dim() == 1
        self.__cuda_array_interface__ = {"data": (pinned.data_ptr(), False), "shape": tuple(pinned.shape),
                                         "typestr": "<i8", "version": 3, "strides": None}


def device_view(pinned: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(_DeviceArray(pinned), device="cuda")


def variants(engine, concurrency: int) -> dict:
    """name -> a function queueing one step of that variant."""
    graphs = engine.runner.graphs
    size = graphs.rung(concurrency)
    graph, buffers = graphs.graphs[size], graphs.buffers
    second, _ = capture_graph(lambda: graphs._forward(size), torch.cuda.graph_pool_handle())
    mirrors = [m[0] for m in buffers._mirrors]
    width = max(int(buffers._field(m.numpy(), "block_width")[0]) for m in mirrors)  # as the engine's last steps
    used = buffers._fields_end + size * width
    views = []
    try:
        views = [device_view(m) for m in mirrors]
    except Exception as error:  # reported, and that variant left out
        print(f"no device view of the pinned mirrors: {error!r}", flush=True)
    tokens_out = torch.empty(concurrency, dtype=torch.int64, pin_memory=True)
    turn = {"k": 0, "previous": None}

    def next_turn() -> int:
        turn["k"] += 1
        return turn["k"] % 2

    def copy_in(k: int) -> None:
        buffers.meta[:used].copy_(mirrors[k][:used], non_blocking=True)

    def copy_in_by_kernel(k: int) -> None:
        torch.add(views[k][:used], 0, out=buffers.meta[:used])

    def fresh_out() -> torch.cuda.Event:
        host = torch.empty(concurrency, dtype=torch.int64, pin_memory=True)
        host.copy_(buffers.sampled_tokens[:concurrency], non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return ready

    def depth1() -> None:
        copy_in(next_turn())
        graph.replay()
        ready, previous = fresh_out(), turn["previous"]
        if previous is not None:
            previous.synchronize()
        turn["previous"] = ready

    table = {
        "replay": lambda: graph.replay(),
        "replay_two_execs": lambda: (graph if next_turn() else second).replay(),
        "copy_in": lambda: (copy_in(next_turn()), graph.replay()),
        "copy_in_two_execs": lambda: (copy_in(k := next_turn()), (graph if k else second).replay()),
        "copy_in_out": lambda: (copy_in(next_turn()), graph.replay(),
                                tokens_out.copy_(buffers.sampled_tokens[:concurrency], non_blocking=True)),
        "copy_in_out_fresh": lambda: (copy_in(next_turn()), graph.replay(), fresh_out()),
        "depth1": depth1,
    }
    if views:
        table["copy_in_by_kernel"] = lambda: (copy_in_by_kernel(next_turn()), graph.replay())
    # Last: the engine's steps lengthen every sequence, so the graph is timed again after them (replay_after,
    # over the contexts the engine ended at) and the engine is set against the mean of both replays.
    table["engine"] = lambda: engine.step(final_only=True)
    table["engine_gc_off"] = lambda: engine.step(final_only=True)  # measure() turns the collector off
    table["replay_after"] = lambda: graph.replay()
    return table


def per_step_ms(step, steps: int, gc_off: bool = False) -> float:
    if gc_off:
        gc.disable()
    try:
        for _ in range(3):  # and one more in time_eager_us
            step()
        return time_eager_us(step, steps) / 1e3
    finally:
        gc.enable()


def quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    at = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)  # noqa: E731
    return {"min": at(0), "p50": at(0.5), "p90": at(0.9), "max": at(1.0),
            "mean": round(sum(ordered) / len(ordered), 4)}


def engine_timeline(engine, concurrency: int, steps: int) -> dict:
    """The engine's steps with CUDA events around each replay of the rung's graph: the GPU time from a
    graph's end to the next one's start, the host's time per step, and how many graphs were launched
    after the one before had already finished on the GPU (that graph's end event done at the launch)."""
    graphs = engine.runner.graphs
    graph = graphs.graphs[graphs.rung(concurrency)]
    host_ms = []
    with replay_events(graph) as (marks, late):
        for _ in range(steps):
            start = time.perf_counter()
            engine.step(final_only=True)
            host_ms.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    between = [end.elapsed_time(begin) for (_, end), (begin, _) in zip(marks, marks[1:])]
    largest = sorted(range(len(between)), key=lambda i: -between[i])[:5]
    return {"steps": steps, "between_graphs_ms": quantiles(between), "graph_ms": quantiles(
                [b.elapsed_time(e) for b, e in marks]), "host_step_ms": quantiles(host_ms),
            "late_launches": sum(late),
            "largest_gaps": [{"step": i + 1, "ms": round(between[i], 4), "launched_late": late[i]} for i in largest]}


def measure(engine, tokens, concurrency: int, steps: int, rounds: int) -> dict:
    # Only the engine variants generate: 8 steps here, then steps + 4 each a round (time_eager_us's warm-ups
    # too), and the timeline's steps.
    params = SamplingParams(max_tokens=8 + rounds * 2 * (steps + 4) + steps + 16, temperature=0, ignore_eos=True,
                            detokenize=False)
    ids = [f"gaps{concurrency}-{i}-{time.monotonic_ns()}" for i in range(concurrency)]
    for request_id in ids:
        engine.add_request(request_id, tokens(128), params)
    for _ in range(8):  # the prompts' pass, then decode steps
        engine.step(final_only=True)
    table = variants(engine, concurrency)
    row = {"concurrency": concurrency, "rung": engine.runner.graphs.rung(concurrency), "ms_per_step": {}}
    for _ in range(rounds):
        for name, step in table.items():
            ms = per_step_ms(step, steps, gc_off=name.endswith("_gc_off"))
            row["ms_per_step"].setdefault(name, []).append(round(ms, 4))
    row["engine_timeline"] = engine_timeline(engine, concurrency, steps)
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    times = row["ms_per_step"]
    # Per round, each variant over the replay of that round (the engine over the mean of the round's two).
    over = {name: [t - r for t, r in zip(times[name], times["replay"])] for name in times
            if not name.startswith("engine")}
    for name in ("engine", "engine_gc_off"):
        over[name] = [t - (r + a) / 2 for t, r, a in zip(times[name], times["replay"], times["replay_after"])]
    row["over_replay_ms"] = {name: round(min(values), 4) for name, values in over.items()}
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--concurrency", default="32,128")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    engine = dummy_engine(args.shape, max_num_seqs=128, max_model_len=4096, max_num_batched_tokens=16384)
    tokens = random_tokens(engine.model_config.vocab_size)
    result = {**results_io.header(), "shape": args.shape, "steps": args.steps, "rows": []}
    for concurrency in (int(c) for c in args.concurrency.split(",") if c):
        row = measure(engine, tokens, concurrency, args.steps, args.rounds)
        result["rows"].append(row)
        results_io.write(args.out, result)
        print(f"C={concurrency} (rung {row['rung']})", flush=True)
        for name, times in row["ms_per_step"].items():
            print(f"  {name:22s} {' '.join(f'{t:8.4f}' for t in times)}  {row['over_replay_ms'][name]:+.4f} ms",
                  flush=True)
        print("  engine timeline", row["engine_timeline"], flush=True)


if __name__ == "__main__":
    main()
