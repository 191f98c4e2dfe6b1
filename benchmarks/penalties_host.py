"""The host's part of a step with penalties, milliseconds a step, on the CPU: Sampler.penalty_tokens, the
rows' prompt and output token lists with their offsets (on a CPU device, so the copies are host copies too).

    python benchmarks/penalties_host.py --out benchmarks/results/penalties_host_cpu.json [--shapes 32x128,32x8192]

Shapes are rows x prompt tokens, each row with 200 generated tokens, at the Qwen3.5 vocabulary.
`first_step`: the first call, which makes each request's distinct prompt tokens and its output array.
`step`: a later call, after every row gained one output token (as a decode step's rows do), mean of 5.
"""

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from deltaserve.engine.request import Request  # noqa: E402
from deltaserve.runner import sampler as sampler_module  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402

VOCAB = 248320
GENERATED = 200


def requests(rows: int, prompt: int) -> list[Request]:
    params = SamplingParams(temperature=0.8, repetition_penalty=1.1)
    return [Request(f"r{i}", [random.randrange(VOCAB) for _ in range(prompt)], params, GENERATED + 10,
                    output_token_ids=[random.randrange(VOCAB) for _ in range(GENERATED)]) for i in range(rows)]


def shape_row(rows: int, prompt: int) -> dict:
    batch = requests(rows, prompt)
    sampler = sampler_module.Sampler(VOCAB, torch.device("cpu"), seed=0)
    start = time.perf_counter()
    sampler.penalty_tokens(batch)
    first = time.perf_counter() - start
    steps = []
    for _ in range(5):
        for r in batch:
            r.output_token_ids.append(random.randrange(VOCAB))
        start = time.perf_counter()
        sampler.penalty_tokens(batch)
        steps.append(time.perf_counter() - start)
    return {"rows": rows, "prompt_tokens": prompt, "generated_tokens": GENERATED, "first_step": round(first * 1e3, 2),
            "step": round(sum(steps) / len(steps) * 1e3, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32x128,128x128,32x8192,128x8192")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    random.seed(0)
    result = {**results_io.header(), "cpu_cores": os.cpu_count(), "vocab": VOCAB, "ms_per_step": []}
    for shape in args.shapes.split(","):
        rows, prompt = (int(n) for n in shape.split("x"))
        result["ms_per_step"].append(shape_row(rows, prompt))
        print(result["ms_per_step"][-1], flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
