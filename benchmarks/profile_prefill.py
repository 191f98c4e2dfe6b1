"""Where a long prefill's time goes: the CUDA kernels of one prompt's first token, by total time.

    python benchmarks/profile_prefill.py qwen3.5-35b-a3b --tokens 8192 --out benchmarks/results/profile_prefill_SHAPE.json
    python benchmarks/profile_prefill.py qwen3.5-9b --tokens 128 --prompts 128 --out ...   (a closed batch's prefill)

The engine is the one engine_bench.py measures prefill on (random weights, no prefix cache, the whole
batch in one pass). Each length runs once to compile its kernels, once timed, once under the profiler
(and with --gaps once more, for the GPU's idle gaps in the step that prefills, the requests added before
it, as engine_bench.py times it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.engine_bench import run_batch  # noqa: E402
from benchmarks.profile_steps import kernel_table  # noqa: E402
from benchmarks.shapes import dummy_engine, random_tokens  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402


CALL = "idle_gaps_call"  # the profiled call's range; on the GPU it also spans all of the call's work


def idle_gaps(fn, min_us: float = 50.0, rows: int = 10) -> dict:
    """Where the GPU waits during fn: its kernels' and copies' busy time and span, the gaps between them
    longer than min_us (with what ran before and after each), and the host's time before the first and
    after the last (lead_ms, tail_ms: fn's own span on the host against the GPU's), from one profiled run."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # The profiler asks for its first activity buffer at the first GPU work it sees, on the host (1.9
        # ms in the 9B 8k pass's kernel table at b9f4b93): taken here, it stays out of the call's lead.
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        with record_function(CALL):
            fn()
            torch.cuda.synchronize()
    call = next(e for e in prof.events() if e.name == CALL and e.device_type.name == "CPU")
    # The profiler mirrors the call's range on the GPU (a user annotation over all its work): counted as
    # work it would double the busy time and close every gap. The warm-up's work came before the call.
    work = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if e.device_type.name == "CUDA" and e.name != CALL and e.time_range.start >= call.time_range.start)
    gaps, end, before = [], work[0][1], work[0][2]
    for start, stop, name in work[1:]:
        if start - end > min_us:
            gaps.append({"ms": round((start - end) / 1e3, 3), "after": before[:60], "before": name[:60]})
        if stop > end:
            end, before = stop, name
    gaps.sort(key=lambda g: -g["ms"])
    return {"busy_ms": round(sum(b - a for a, b, _ in work) / 1e3, 2), "span_ms": round((end - work[0][0]) / 1e3, 2),
            "call_ms": round((call.time_range.end - call.time_range.start) / 1e3, 2),
            "lead_ms": round((work[0][0] - call.time_range.start) / 1e3, 2),
            "tail_ms": round((call.time_range.end - end) / 1e3, 2),
            f"idle_ms_in_gaps_over_{int(min_us)}_us": round(sum(g["ms"] for g in gaps), 2), "gaps": gaps[:rows]}


def first_step_gaps(engine, prompts: list[list[int]]) -> dict:
    """idle_gaps of the engine step that prefills `prompts` (one step: the token budget covers them), the
    requests added before it, as engine_bench.py times it; then the batch is run out."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, detokenize=False)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"gaps{time.monotonic_ns()}-{i}", prompt, params)
    gaps = idle_gaps(engine.step)
    while engine.has_unfinished_requests():
        engine.step(final_only=True)
    return gaps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--tokens", default="8192", help="prompt lengths, comma-separated")
    ap.add_argument("--prompts", type=int, default=1, help="prompts of each length, prefilled together")
    ap.add_argument("--rows", type=int, default=40, help="rows of each kernel table")
    ap.add_argument("--gaps", action="store_true", help="also where the GPU idles during the pass")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="the step's token budget (default: the whole batch in one pass); the kernel table then "
                         "sums every chunk's pass")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    lengths = [int(n) for n in args.tokens.split(",")]
    batch = args.prompts
    engine = dummy_engine(args.shape, max_num_seqs=batch,
                          max_num_batched_tokens=args.max_num_batched_tokens or max(lengths) * batch,
                          max_model_len=max(lengths) + 256, enable_prefix_caching=False)
    tokens = random_tokens(engine.model_config.vocab_size)
    result = {**results_io.header(), "shape": args.shape, "prefill": []}
    for n in lengths:
        prompts = lambda: [tokens(n) for _ in range(batch)]  # noqa: E731
        run_batch(engine, prompts(), 1)  # compiles this length's kernels
        ttft = run_batch(engine, prompts(), 1)["prefill_s"]
        table = kernel_table(lambda: run_batch(engine, prompts(), 1), args.rows)
        entry = {"tokens": n, "prompts": batch, "ttft_s": round(ttft, 4), "kernels": table}
        if args.gaps:
            entry["idle"] = first_step_gaps(engine, prompts())
        result["prefill"].append(entry)
        print(f"{args.shape} {batch} x {n} tokens: {ttft * 1e3:.1f} ms", flush=True)
        for row in table:
            if not row["name"].startswith("HOST"):
                print(f"  {row['ms']:9.3f} ms {row['calls']:6d}  {row['name']}", flush=True)
        if args.gaps:
            print("  idle:", {k: v for k, v in entry["idle"].items() if k != "gaps"}, flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
