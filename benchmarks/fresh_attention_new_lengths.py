"""What the dense attention of fresh prompts (attention/fresh_prefill.py: torch's sdpa, cuDNN's kernel on
the H200) costs the host at a prompt length it has not seen: each length's first call against its second,
timed to the end of the GPU's work, in one process at the Qwen3.5-9B shape's attention.

    python benchmarks/fresh_attention_new_lengths.py --lengths 1024,1040,1100,2000 --out benchmarks/results/...
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from deltaserve.kernels.attention.fresh_prefill import causal_attention_fresh  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM = 16, 4, 256


def timed_call(tokens: int) -> float:
    """Seconds of one causal_attention_fresh call over a `tokens`-row prompt, host and GPU."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(tokens, Q_HEADS, HEAD_DIM, **bf16)
    k, v = torch.randn(tokens, KV_HEADS, HEAD_DIM, **bf16), torch.randn(tokens, KV_HEADS, HEAD_DIM, **bf16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = causal_attention_fresh(q, k, v, [0, tokens], HEAD_DIM**-0.5)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,1040,1100,1500,2000,2048")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {**results_io.header(), "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "lengths": []}
    for n in [int(x) for x in args.lengths.split(",")]:
        first, second, third = (timed_call(n) for _ in range(3))
        row = {"tokens": n, "first_ms": round(first * 1e3, 3), "second_ms": round(second * 1e3, 3),
               "third_ms": round(third * 1e3, 3)}
        result["lengths"].append(row)
        print(row, flush=True)
    results_io.write(args.out, result)


if __name__ == "__main__":
    main()
