"""What the start-up warm-up leaves behind that slows later decode steps, measured in one process.

    python benchmarks/warm_up_cost.py qwen3.5-9b --concurrency 32 --sleep 20 --out benchmarks/results/X.json

The engine starts without its warm-up. Closed decode batches (engine_bench.py's instrument) are timed before
the warm-up, after it (`--groups` picks which of its groups run: `all`, or a slice `a:b` of warm_up_groups'
list), and after `--sleep` idle seconds. Each phase also records the GPU's clocks and temperature, the
batch's decode graph replayed back to back (the GPU's own time for a step, no host work between), and the
CUDA kernels of a short profiled batch by total time per step: a difference shows as slower kernels, as the
same kernels further apart, or as time between the graphs. `--trigger` runs instead of the warm-up groups
one sdpa call of a long fresh prompt (torch's choice of backend, or one pinned), one cuDNN convolution,
cudnnCreate alone, cuDNN's sub-libraries loaded with no call made, new streams, a mapped pinned host buffer,
two buffers from cudaMalloc, one call into cuFFT or cuSOLVER, one kernel on a stream of its own (kept, or
destroyed once it is done), one cudaMemsetAsync on a stream of its own, or a new stack size;
`--attention-first` runs one attention call before the engine starts; `--restore-limits` sets the context's
limits, flags and cache config back after the trigger. `--trigger-calls` lists the CUDA calls
cudnnCreate makes. `--trace` records in each phase a CUPTI trace of the decode graph's replays
(graph_timeline.py): each kernel's time and its gap to the next, which boundaries' gaps grew, and what each
kernel adds to the replay end to end, by the kernel before it. `--chains` also replays and traces in each
phase pdl_after_cudnn's whole and mlp chains, captured in the engine's process; `--edges` records the type
of every edge of the decode graph and of those chains, captured before the trigger and again after it
(graph_edges.py). `--own-stream` runs the engine and every phase on a stream of their own rather than the
process's default stream (`--stream-priority` sets its priority).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.engine_bench import run_batch, sync  # noqa: E402
from benchmarks.graph_edges import cublas_edges, edge_kinds, edges  # noqa: E402
from benchmarks.graph_timeline import (effective_by_pair, gap_changes, gaps_by_kind, graph_boundaries,  # noqa: E402
                                       replay_us)
from benchmarks.graph_timeline import replay_ms as graph_replay_ms  # noqa: E402
from benchmarks.pdl_after_cudnn import chain  # noqa: E402
from benchmarks.process_triggers import (api_calls, create_streams, cudart, cudnn_convolution,  # noqa: E402
                                         cudnn_handle, cudnn_libraries, destroyed_stream_kernel,
                                         fresh_attention, libcuda, mapped_host_buffer, other_library,
                                         raw_device_buffers, runtime, side_stream_kernel, side_stream_memset)
from benchmarks.shapes import dummy_engine, random_tokens  # noqa: E402
from deltaserve.engine.warm_up import warm_up, warm_up_groups  # noqa: E402
from deltaserve.runner.cuda_graphs import capture_graph  # noqa: E402

GENERATED = 256
PROFILED = 32  # tokens of the profiled batch
IN_PROCESS_CHAINS = ("whole", "mlp")


def gpu_clocks() -> dict:
    """The SM and memory clocks (MHz), temperature (C) and power (W) nvidia-smi reads now."""
    fields = "clocks.sm,clocks.mem,temperature.gpu,power.draw"
    try:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError):
        return {}
    return dict(zip(fields.split(","), (float(v) for v in line.split(","))))


LIMITS = (("stack_size", 0), ("printf_fifo_size", 1), ("malloc_heap_size", 2), ("max_l2_fetch_granularity", 5),
          ("persisting_l2_cache_size", 6))  # cudaLimit codes


def context_limits() -> dict:
    """What a library can leave changed in the whole CUDA context: its limits (cudaDeviceGetLimit: the
    per-thread stack, the printf and malloc heaps, the L2 fetch granularity and persisting set-aside,
    bytes), the device's and the context's flags, and its preferred cache config."""
    lib, limits = cudart(), {}
    for key, code in LIMITS if lib is not None else ():
        value = ctypes.c_size_t()
        if lib.cudaDeviceGetLimit(ctypes.byref(value), code) == 0:
            limits[key] = value.value
    flags, cache = ctypes.c_uint(), ctypes.c_int()
    if lib is not None and lib.cudaGetDeviceFlags(ctypes.byref(flags)) == 0:
        limits["device_flags"] = flags.value  # the host's way of waiting (spin, yield, blocking sync)
    if lib is not None and lib.cudaDeviceGetCacheConfig(ctypes.byref(cache)) == 0:
        # the L1 / shared memory split preferred for kernels that set none: kernels wanting different
        # splits do not share a multiprocessor at once, which would keep a dependent launch from overlapping
        limits["cache_config"] = cache.value
    driver, ctx_flags = libcuda(), ctypes.c_uint()
    if driver is not None and driver.cuCtxGetFlags(ctypes.byref(ctx_flags)) == 0:
        limits["context_flags"] = ctx_flags.value
    return limits


def restore_limits(before: dict) -> dict:
    """Sets back each limit, the cache config and the context's flags where they differ from `before`;
    returns those it set."""
    lib, now, restored = cudart(), context_limits(), {}
    for key, code in LIMITS:
        if key in before and now.get(key) != before[key]:
            lib.cudaDeviceSetLimit(code, ctypes.c_size_t(before[key]))
            restored[key] = (now.get(key), before[key])
    if "cache_config" in before and now.get("cache_config") != before["cache_config"]:
        lib.cudaDeviceSetCacheConfig(before["cache_config"])
        restored["cache_config"] = (now.get("cache_config"), before["cache_config"])
    if "context_flags" in before and now.get("context_flags") != before["context_flags"]:
        libcuda().cuCtxSetFlags(ctypes.c_uint(before["context_flags"]))
        restored["context_flags"] = (now.get("context_flags"), before["context_flags"])
    return restored


def kernel_times(engine, prompts) -> dict[str, float]:
    """{kernel: device ms per decode step} over a profiled closed batch of PROFILED tokens."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        r = run_batch(engine, prompts, PROFILED)
        sync()
    steps = r["decode_steps"] + 1  # the prefill step's kernels are in the table too
    return {e.key[:80]: e.device_time_total / 1e3 / steps for e in prof.key_averages() if e.device_time_total > 0}


def replay_ms(engine, size: int, replays: int = 200) -> float | None:
    """Device ms per replay of the decode graph of `size` rows, replayed back to back with nothing else
    launched: the graph's own time on the GPU, with no host work of the engine's between steps. The
    buffers hold the last batch's metadata; what the replays write lands in freed KV blocks and state
    slots, which the next batch's sequences clear or overwrite before they read them."""
    graph = decode_graph(engine, size)
    return None if graph is None else round(graph_replay_ms(graph, replays), 4)


def decode_graph(engine, size: int):
    """The engine's decode graph of `size` rows; None without graphs or a GPU."""
    graphs = getattr(engine.runner, "graphs", None)
    if not torch.cuda.is_available() or graphs is None or size not in graphs.graphs:
        return None
    return graphs.graphs[size]


def kept_decode_graph(engine, size: int) -> torch.cuda.CUDAGraph:
    """The decode graph of `size` rows captured again as the engine captures it, its template kept."""
    return engine.runner.graphs.capture_size(size, torch.cuda.graph_pool_handle(), keep_graph=True)[0]


def chain_steps(rows: int) -> dict:
    """pdl_after_cudnn's chains of IN_PROCESS_CHAINS at `rows` rows, their weights allocated now."""
    return {kind: chain(kind, rows) for kind in IN_PROCESS_CHAINS}


def capture_kept(steps: dict) -> dict:
    """Each step captured as a graph that keeps its template, for graph_edges."""
    return {kind: capture_graph(step, None, keep_graph=True)[0] for kind, step in steps.items()}


def graph_edges(engine, size: int, chains: dict) -> dict:
    """Edge types of the decode graph captured again now, and of the chains' graphs given."""
    decode = edges(kept_decode_graph(engine, size))
    return {"decode": edge_kinds(decode), "decode_cublas_edges": cublas_edges(decode),
            **{kind: edge_kinds(edges(g)) for kind, g in chains.items()}}


def chain_timings(chains: dict) -> dict:
    """Each chain's graph replayed back to back twice (us) and its boundaries' gaps by kind."""
    return {kind: {"replay_us": [replay_us(g) for _ in range(2)],
                   "gaps": gaps_by_kind(graph_boundaries(g))} for kind, g in chains.items()}


def run_groups(engine, spec: str) -> int:
    """The warm-up's groups `spec` (`all` or `a:b`) through the engine as warm_up() runs them; their count."""
    groups = warm_up_groups(engine.config.max_num_seqs, engine.config.max_num_batched_tokens, engine.max_model_len)
    if spec != "all":
        a, b = (int(x) if x else None for x in spec.split(":"))
        groups = groups[a:b]
    warm_up(engine, groups)
    return len(groups)


def set_stack_size(nbytes: int) -> None:
    """Sets the context's per-thread stack size (cudaDeviceSetLimit), as a library's kernel that needs more
    stack than the context gives makes the driver do."""
    if runtime().cudaDeviceSetLimit(dict(LIMITS)["stack_size"], ctypes.c_size_t(nbytes)) != 0:
        raise RuntimeError("cudaDeviceSetLimit(cudaLimitStackSize) failed")
    torch.cuda.synchronize()


def host_state() -> dict:
    """The process's CPU affinity and OS thread count: what a library's start-up can change on the host side."""
    return {"cpus": len(os.sched_getaffinity(0)), "threads": len(os.listdir("/proc/self/task"))}


def phase(engine, name: str, prompts, repeats: int, trace: bool = False, chains: dict | None = None) -> dict:
    clocks_before = gpu_clocks()
    steps_ms = []
    for _ in range(repeats):
        r = run_batch(engine, prompts(), GENERATED)
        steps_ms.append(round(r["decode_s"] / r["decode_steps"] * 1e3, 3))
    clocks_after = gpu_clocks()
    replays = [replay_ms(engine, len(prompts())) for _ in range(2)]
    kernels = kernel_times(engine, prompts())
    graph = decode_graph(engine, len(prompts())) if trace else None
    boundaries = graph_boundaries(graph) if graph is not None else None
    row = {"phase": name, "step_ms": steps_ms, "graph_replay_ms": replays, "clocks_before": clocks_before,
           "clocks_after": clocks_after,
           "context_limits": context_limits(), "host": host_state(),
           "kernels_ms_per_step": dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
           "graph_boundaries": boundaries, "chains": chain_timings(chains) if chains else None,
           "effective_us_by_pair": effective_by_pair(boundaries) if boundaries else None}
    print(name, steps_ms, "replay", replays, clocks_before, clocks_after, round(sum(kernels.values()), 3),
          row["context_limits"], row["host"], flush=True)
    for kind, timing in (row["chains"] or {}).items():
        print(f"  chain {kind}: {timing['replay_us']} us, {timing['gaps']}", flush=True)
    return row


def plain_triggers(args) -> dict:
    """The triggers that only run something: name -> (what runs, the next phase's name)."""
    return {
        "cudnn-conv": (cudnn_convolution, "after one cuDNN convolution"),
        "streams": (lambda: create_streams(args.streams), f"after {args.streams} streams created"),
        "mapped-host": (mapped_host_buffer, "after a mapped pinned host buffer"),
        "malloc": (lambda: raw_device_buffers(args.malloc_bytes),
                   f"after two {args.malloc_bytes}-byte buffers from cudaMalloc"),
        "cufft": (lambda: other_library("cufft"), "after one cufft call"),
        "cusolver": (lambda: other_library("cusolver"), "after one cusolver call"),
        "side-stream": (side_stream_kernel, "after one kernel on a stream of its own"),
        "side-memset": (side_stream_memset, "after one cudaMemsetAsync on a stream of its own"),
        "destroyed-stream": (destroyed_stream_kernel, "after one kernel on a stream since destroyed"),
        "stack": (lambda: set_stack_size(args.stack_bytes), f"after the stack size set to {args.stack_bytes} bytes"),
    }


def run_trigger(engine, args, result: dict) -> str:
    """Runs what --trigger names between the first two phases; what it found goes into `result`. Returns
    the next phase's name."""
    plain = plain_triggers(args)
    if args.trigger in plain:
        run, name = plain[args.trigger]
        run()
        return name
    if args.trigger == "warm-up":
        started = time.perf_counter()
        count = run_groups(engine, args.groups)
        sync()
        result["warm_up"] = {"groups": count, "s": round(time.perf_counter() - started, 2)}
        return f"after warm-up ({count} groups)"
    if args.trigger == "cudnn-handle":
        if args.trigger_calls:
            result["trigger_calls"] = api_calls(cudnn_handle)
            print("cudnnCreate's CUDA calls:", result["trigger_calls"], flush=True)
        else:
            cudnn_handle()
        return "after cudnnCreate"
    if args.trigger == "cudnn-libraries":
        result["libraries"] = cudnn_libraries()
        return "after cuDNN's sub-libraries loaded"
    fresh_attention(args.trigger)
    return f"after one fresh-prefill attention call ({args.trigger} backend)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--groups", default="all", help="the warm-up groups to run: all, or a slice a:b")
    ap.add_argument("--trigger", default="warm-up",
                    choices=["warm-up", "default", "flash", "cudnn", "cudnn-side-stream", "cudnn-conv", "cudnn-handle",
                             "cudnn-libraries", "streams", "mapped-host", "malloc", "cufft", "cusolver",
                             "side-stream", "side-memset", "destroyed-stream", "stack"],
                    help="what runs between the first two phases: the warm-up's groups, one fresh-prefill "
                    "attention call with torch's sdpa backend of that name, one cuDNN convolution, cudnnCreate "
                    "alone, cuDNN's sub-libraries loaded with no cuDNN call, --streams new streams, a mapped "
                    "pinned host buffer, two buffers of --malloc-bytes from cudaMalloc, one cuFFT or cuSOLVER "
                    "call, one small kernel on a stream of its own (kept, or destroyed after it), one "
                    "cudaMemsetAsync on a stream of its own, or a new stack size (--stack-bytes)")
    ap.add_argument("--stack-bytes", type=int, default=8192)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--malloc-bytes", type=int, default=4 << 20)
    ap.add_argument("--attention-first", default=None, choices=["default", "flash", "cudnn"],
                    help="one fresh-prefill attention call with that backend before the engine starts")
    ap.add_argument("--restore-limits", action="store_true",
                    help="after the trigger, set the context's limits, flags and cache config back to what they "
                    "were before it")
    ap.add_argument("--trace", action="store_true",
                    help="in each phase, a CUPTI trace of the decode graph's replays: each kernel's time and its gap "
                    "to the next, and the boundaries whose gap grew most across the trigger")
    ap.add_argument("--chains", action="store_true",
                    help=f"replay and trace the {IN_PROCESS_CHAINS} chains of pdl_after_cudnn.py in each phase")
    ap.add_argument("--edges", action="store_true",
                    help="the edge types of the decode graph (and the chains) captured before and after the trigger")
    ap.add_argument("--trigger-calls", action="store_true",
                    help="with --trigger cudnn-handle, record the CUDA runtime and driver calls cudnnCreate makes")
    ap.add_argument("--own-stream", action="store_true",
                    help="run the engine and every phase on a stream of their own, not the process's default stream")
    ap.add_argument("--stream-priority", type=int, default=0,
                    help="with --own-stream, that stream's priority (lower is higher; -1 or less for high)")
    ap.add_argument("--sleep", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-model-len", type=int, default=33024)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    stream = torch.cuda.Stream(priority=args.stream_priority) if args.own_stream else None
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        measure(args)


def measure(args) -> None:
    """The phases and the trigger between them, on the current stream; writes args.out."""
    c = args.concurrency
    if args.attention_first:
        fresh_attention(args.attention_first)
    steps = chain_steps(args.concurrency) if args.chains else {}  # their weights allocated before the engine's pools
    engine = dummy_engine(args.shape, max_num_seqs=c, max_num_batched_tokens=args.prompt_len * c,
                          max_model_len=args.max_model_len, enable_prefix_caching=False, warm_up=False)
    tokens = random_tokens(engine.model_config.vocab_size)
    prompts = lambda: [tokens(args.prompt_len) for _ in range(c)]  # noqa: E731
    run_batch(engine, prompts(), 16)  # kernels compiled and tuned at this concurrency
    chains = capture_kept(steps)
    result = {**results_io.header(), "shape": args.shape, "concurrency": c, "trigger": args.trigger,
              "groups": args.groups, "attention_first": args.attention_first, "own_stream": args.own_stream,
              "stream_priority": args.stream_priority if args.own_stream else None, "phases": []}
    if args.edges:
        result["edges_before"] = graph_edges(engine, c, chains)
    result["phases"].append(phase(engine, "before warm-up", prompts, args.repeats, args.trace, chains))
    limits = context_limits()
    name = run_trigger(engine, args, result)
    if args.restore_limits:
        result["restored_limits"] = restore_limits(limits)
        name += f", limits restored: {result['restored_limits']}"
    result["phases"].append(phase(engine, name, prompts, args.repeats, args.trace, chains))
    if args.edges:
        result["edges_after"] = graph_edges(engine, c, capture_kept(steps))
        for when in ("edges_before", "edges_after"):
            print(when, json.dumps({k: v for k, v in result[when].items() if k != "decode_cublas_edges"}))
    time.sleep(args.sleep)
    result["phases"].append(phase(engine, f"after {args.sleep:g} s idle", prompts, args.repeats, args.trace, chains))
    before, after = (result["phases"][i]["kernels_ms_per_step"] for i in (0, 1))
    diff = {k: round(after.get(k, 0) - before.get(k, 0), 4) for k in set(before) | set(after)}
    result["kernel_change_ms_per_step"] = dict(sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15])
    if args.trace and result["phases"][0]["graph_boundaries"]:
        result["graph_gap_changes"] = gap_changes(*(result["phases"][i]["graph_boundaries"] for i in (0, 1)))
        print(json.dumps({k: v for k, v in result["graph_gap_changes"].items() if k != "largest_gap_growth"}))
        for row in result["graph_gap_changes"]["largest_gap_growth"]:
            print(f"  {row['gap_us']} {row['kernel_us']} {row['kernel']} -> {row['next']}")
    results_io.write(args.out, result)
    print("kernels whose time per step changed most after the warm-up (ms):")
    for k, v in result["kernel_change_ms_per_step"].items():
        print(f"  {v:+.4f}  {k}")


if __name__ == "__main__":
    main()
