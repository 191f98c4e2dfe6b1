"""Paged attention where its keys are split (decode of few sequences, short prompts, a prefix-cache hit's
tail) at the default plan: each call's first-call time on an empty Triton cache (its compile, if the
call needs a kernel not compiled yet), its time replayed in a graph, its error against the fp32
reference, and the kernels compiled in all. Runs the tree it is in; run it in two trees to compare.

    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/paged_attention_splits.py --out split_counts.json
    python benchmarks/paged_attention_splits.py --compare base.json new.json --out table.json

Shapes: Qwen3.5-9B's attention (16 query heads, 4 KV heads, head dim 256) and Qwen3.5-35B-A3B's (2 KV
heads), bf16, 16-token pages.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernels_check import attention_inputs, f32, rel_err, time_graph_us  # noqa: E402
from deltaserve.kernels.attention import reference as attn_ref  # noqa: E402


def cases():
    """(name, sequence lengths, rows of each, KV heads)."""
    for kv_heads in (4, 2):
        for batch in (1, 4, 8, 16, 31):
            for ctx in (384, 4096):
                yield f"decode_kv{kv_heads}_B{batch}_ctx{ctx}", [ctx] * batch, [1] * batch, kv_heads
        for n in (32, 48, 64, 100, 200, 400, 800):  # one short prompt: paged, its keys split
            yield f"prompt_kv{kv_heads}_{n}", [n], [n], kv_heads
        for rows in (32, 80, 112):  # a hit's tail beside a graph's 16-row padding sequence
            yield f"hit_tail_kv{kv_heads}_{rows}", [8240 + rows, 16], [rows, 16], kv_heads


def plan_of(inputs, kv_heads: int) -> dict:
    """The default plan of the call, where this tree's kernel module names it."""
    from deltaserve.kernels.attention import triton_paged_attention as paged
    from deltaserve.kernels.sm_count import num_sms

    if not hasattr(paged, "launch_plan"):
        return {}
    q, _, _, starts, lens, _, _ = inputs
    rows = (starts[1:] - starts[:-1]).tolist()
    plan = paged.launch_plan(q.shape[0], lens.shape[0], max(rows), q.shape[1] // kv_heads, kv_heads, q.shape[2],
                             num_sms(q.device))
    return {"block_m": plan.block_m, "splits": plan.splits}


def compiled_kernels() -> int | None:
    """How many variants of the attention and merge kernels this process compiled (None: unknown)."""
    from deltaserve.kernels.attention import triton_paged_attention as paged

    try:
        return sum(len(cache[0]) for fn in (paged._paged_attention_kernel, paged._merge_splits_kernel)
                   for cache in fn.device_caches.values())
    except (AttributeError, TypeError, IndexError):
        return None


def measure(args) -> None:
    from deltaserve.kernels.attention.triton_paged_attention import paged_attention

    torch.manual_seed(0)
    rows = []
    for name, seq_lens, q_lens, kv_heads in cases():
        inputs = attention_inputs(seq_lens, q_lens, kv_heads=kv_heads)
        q, k_cache, v_cache, starts, lens, tables, scale = inputs
        call = lambda: paged_attention(*inputs, max_query_len=max(q_lens))  # noqa: E731
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = call()
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t0) * 1e3
        expected = attn_ref.paged_attention(*f32(q, k_cache, v_cache), starts, lens, tables, scale)
        row = {"name": name, **plan_of(inputs, kv_heads), "first_call_ms": round(first_ms, 1),
               "us": round(time_graph_us(call), 2), "rel_err": rel_err(out, expected)}
        rows.append(row)
        print(row, flush=True)
    results_io.write(args.out, dict(results_io.header(), triton_cache=os.environ.get("TRITON_CACHE_DIR", ""),
                                    compiled_kernels=compiled_kernels(), cases=rows))


def compare(args) -> None:
    """Sets runs side by side: per case, each run's us and first-call ms, and the first run's plan."""
    import json

    runs = [json.load(open(path)) for path in args.compare]
    table = []
    for i, case in enumerate(runs[-1]["cases"]):
        entry = {k: case[k] for k in ("name", "block_m", "splits") if k in case}
        for j, run in enumerate(runs):
            other = run["cases"][i]
            entry[f"us_{j}"], entry[f"first_ms_{j}"] = other["us"], other["first_call_ms"]
        table.append(entry)
        print(" ".join(f"{v}" for v in entry.values()), flush=True)
    print("compiled kernels:", [run.get("compiled_kernels") for run in runs])
    summary = [{k: run[k] for k in ("commit", "date", "compiled_kernels")} for run in runs]
    results_io.write(args.out, dict(results_io.header(), runs=summary, table=table))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", nargs="*", help="result files of earlier runs, to set side by side")
    args = ap.parse_args()
    compare(args) if args.compare else measure(args)


if __name__ == "__main__":
    main()
