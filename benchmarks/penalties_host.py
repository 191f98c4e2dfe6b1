"""The host's part of a step with penalties, milliseconds a step, on the CPU: the flat indices of the rows'
prompt tokens (which the sampler copies to the device for the prompt mask) and of their generated tokens.

    python benchmarks/penalties_host.py --out benchmarks/results/penalties_host_cpu.json [--shapes 32x128,32x8192]

Shapes are rows x prompt tokens, each row with 200 generated tokens, at the Qwen3.5 vocabulary.
`prompt_indices`: Sampler.prompt_indices a step, each request's distinct prompt tokens kept from its first
step (`first_step`: that step). `flat_prompts`: every prompt token of every row listed again, as the sampler
did each step before. `flat_outputs`: the generated tokens' indices, listed each step either way.
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


def ms_per_call(fn, calls: int = 5) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return round((time.perf_counter() - start) / calls * 1e3, 2)


def requests(rows: int, prompt: int) -> list[Request]:
    params = SamplingParams(temperature=0.8, repetition_penalty=1.1)
    return [Request(f"r{i}", [random.randrange(VOCAB) for _ in range(prompt)], params, GENERATED + 1,
                    output_token_ids=[random.randrange(VOCAB) for _ in range(GENERATED)]) for i in range(rows)]


def shape_row(rows: int, prompt: int) -> dict:
    batch = requests(rows, prompt)
    sampler = sampler_module.Sampler(VOCAB, torch.device("cpu"), seed=0)
    start = time.perf_counter()
    sampler.prompt_indices(batch, VOCAB)
    first = round((time.perf_counter() - start) * 1e3, 2)
    flat = lambda lists: sampler_module._flat_indices(lists, VOCAB)  # noqa: E731
    return {"rows": rows, "prompt_tokens": prompt, "generated_tokens": GENERATED, "first_step": first,
            "prompt_indices": ms_per_call(lambda: sampler.prompt_indices(batch, VOCAB)),
            "flat_prompts": ms_per_call(lambda: flat([r.prompt_token_ids for r in batch])),
            "flat_outputs": ms_per_call(lambda: flat([r.output_token_ids for r in batch]))}


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
