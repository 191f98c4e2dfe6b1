"""GPU correctness of the whole engine on tiny random checkpoints written by transformers:

- greedy tokens on the GPU in fp32 identical to the CPU reference path, every architecture;
- in bf16, decode steps replayed as CUDA graphs give the same tokens as the same steps run eagerly.

    python benchmarks/gpu_correctness.py --out benchmarks/results/gpu_correctness.json
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from deltaserve import LLM, SamplingParams  # noqa: E402
from tests.checkpoints import ARCHITECTURES, make_checkpoint  # noqa: E402

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def tokens(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(300) for _ in range(n)] for n in (1, 17, 90, 33)]
    result = {**results_io.header(), "fp32_gpu_vs_cpu": {}, "graph_vs_eager_bf16": {}}
    for arch in ARCHITECTURES:
        path = make_checkpoint(arch, tempfile.mkdtemp())
        cpu = tokens(LLM(path, device="cpu"), prompts)
        gpu = tokens(LLM(path, device="cuda", dtype="float32", max_num_seqs=8), prompts)
        eager = tokens(LLM(path, device="cuda", dtype="bfloat16", enforce_eager=True, max_num_seqs=8), prompts)
        graph = tokens(LLM(path, device="cuda", dtype="bfloat16", max_num_seqs=8), prompts)
        result["fp32_gpu_vs_cpu"][arch] = {"identical": gpu == cpu,
                                           "matching_tokens": sum(a == b for x, y in zip(gpu, cpu) for a, b in zip(x, y)),
                                           "total_tokens": sum(len(x) for x in cpu)}
        result["graph_vs_eager_bf16"][arch] = {"identical": graph == eager}
        print(arch, result["fp32_gpu_vs_cpu"][arch], result["graph_vs_eager_bf16"][arch], flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
