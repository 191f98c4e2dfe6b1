"""Penalties on the GPU at the Qwen3.5 vocabulary: the Triton kernel over the rows' token lists against the
dense torch reference (a [B, V] prompt mask and counts filled from the same lists, then the elementwise
definition), and the sampler's whole penalties step.

    python benchmarks/penalties_device.py --out benchmarks/results/penalties_device.json
        [--shapes 1x128,32x128,128x128,32x8192,128x8192]

Shapes are rows x prompt tokens, each row with 200 generated tokens drawn from a pool of 60 tokens (so
they repeat, as text does), every row with repetition 1.1, frequency 0.3 and presence 0.2.
Checks: the kernel's values against the reference's on the GPU and on the CPU, bit for bit. Times:
`kernel_us` / `dense_us`, device microseconds a call over 20 calls back to back (kernels.apply_penalties
/ reference.apply_penalties on the same lists); `step_ms`, the sampler's penalties step (its host lists,
the copies and the device work, synchronised), each call after every row gained one output token, as a
decode step's rows do: median of 20 calls, after a first call that made the rows' lists.
"""

import argparse
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernel_times import time_us  # noqa: E402
from deltaserve import kernels  # noqa: E402
from deltaserve.engine.request import Request  # noqa: E402
from deltaserve.kernels.sampling import reference  # noqa: E402
from deltaserve.runner import sampler as sampler_module  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402

VOCAB = 248320
GENERATED = 200


def requests(rows: int, prompt: int) -> list[Request]:
    params = SamplingParams(temperature=0.8, repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2)
    pool = [random.randrange(VOCAB) for _ in range(60)]
    return [Request(f"r{i}", [random.randrange(VOCAB) for _ in range(prompt)], params, GENERATED + 1,
                    output_token_ids=[random.choice(pool) for _ in range(GENERATED)]) for i in range(rows)]


def step_ms(fn, calls: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return round(statistics.median(samples) * 1e3, 3)


def shape_row(rows: int, prompt: int) -> dict:
    batch = requests(rows, prompt)
    cuda = torch.device("cuda")
    sampler = sampler_module.Sampler(VOCAB, cuda, seed=0)
    logits = torch.randn(rows, VOCAB, device=cuda) * 3
    per_row = lambda value: torch.full((rows,), value, device=cuda)  # noqa: E731
    args = (logits, *sampler.penalty_tokens(batch), per_row(1.1), per_row(0.3), per_row(0.2))
    out = kernels.apply_penalties(*args)
    cpu_args = [a.cpu() if isinstance(a, torch.Tensor) else
                reference.RowTokens(a.tokens.cpu(), a.offsets.cpu(), a.longest) for a in args]

    def step():
        for r in batch:
            r.output_token_ids.append(random.randrange(VOCAB))
        sampler._penalise(logits, batch)

    return {"rows": rows, "prompt_tokens": prompt, "generated_tokens": GENERATED,
            "equal_to_gpu_reference": bool(torch.equal(out, reference.apply_penalties(*args))),
            "equal_to_cpu_reference": bool(torch.equal(out.cpu(), reference.apply_penalties(*cpu_args))),
            "kernel_us": round(time_us(lambda: kernels.apply_penalties(*args), calls=20, warm=3), 1),
            "dense_us": round(time_us(lambda: reference.apply_penalties(*args), calls=20, warm=3), 1),
            "step_ms": step_ms(step)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x128,32x128,128x128,32x8192,128x8192")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    random.seed(0)
    result = {**results_io.header(), "vocab": VOCAB, "shapes": []}
    for shape in args.shapes.split(","):
        rows, prompt = (int(n) for n in shape.split("x"))
        result["shapes"].append(shape_row(rows, prompt))
        print(result["shapes"][-1], flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
