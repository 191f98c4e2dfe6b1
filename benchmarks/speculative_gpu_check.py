"""Speculative decoding on a GPU, alone (the row gpu_correctness.py has for it, without the others): on a tiny
random hybrid checkpoint given an MTP head, greedy speculative decoding with its verify and drafting graphs gives
in fp32 the CPU's plain greedy tokens, seeded sampled rows beside greedy ones the CPU's speculative tokens; in bf16
the share of plain greedy tokens it matches.

    python benchmarks/speculative_gpu_check.py --out benchmarks/results/speculative_gpu_check.json [--archs qwen3.5]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.gpu_correctness import speculative_alike  # noqa: E402
from deltaserve import LLM  # noqa: E402
from tests.checkpoints import add_mtp_weights, make_checkpoint  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default="qwen3.5,qwen3.5-moe,qwen3-next")
    args = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(300) for _ in range(n)] for n in (1, 17, 90, 33)]
    result = {**results_io.header(), "speculative_mtp_gpu_vs_cpu": {}}
    for arch in args.archs.split(","):
        path = make_checkpoint(arch, tempfile.mkdtemp())
        add_mtp_weights(path, seed=0)
        cpu_llm = LLM(path, device="cpu")
        result["speculative_mtp_gpu_vs_cpu"][arch] = speculative_alike(path, cpu_llm, prompts, {})
        print(arch, result["speculative_mtp_gpu_vs_cpu"][arch], flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
