"""A grammar's token mask on the GPU at the Qwen3.5 vocabulary: the Triton kernel against the torch reference.

    python benchmarks/token_bitmask.py --out benchmarks/results/token_bitmask.json [--rows 1,32,128]

For a batch of B rows, R of them held to a grammar (all, or every other row), on fresh random logits and
bitmasks: whether kernels.sampling.triton_token_bitmask gives the reference's bits, and microseconds a call
(20 calls back to back, launches included, as the sampler calls it after a decode graph) for the reference,
the kernel, and a plain copy of the logits (which both make: the logits stay the model's for logprobs). Floor:
the copy's read and write and the bitmask's read, over 4.24 TB/s (an H200's copy bandwidth).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernel_times import time_us  # noqa: E402
from deltaserve.kernels.sampling import reference  # noqa: E402
from deltaserve.kernels.sampling.triton_token_bitmask import apply_token_bitmask  # noqa: E402

VOCAB = 248320  # Qwen3.5's padded vocabulary
BANDWIDTH = 4.24e12


def case(rows: int, held_every: int) -> dict:
    logits = torch.randn(rows, VOCAB, device="cuda") * 3
    held = torch.arange(0, rows, held_every, device="cuda")
    mask_rows = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
    mask_rows[held] = torch.arange(len(held), dtype=torch.int32, device="cuda")
    bitmask = torch.randint(-2**31, 2**31 - 1, (len(held), -(-VOCAB // 32)), dtype=torch.int32, device="cuda")
    same = torch.equal(apply_token_bitmask(logits, bitmask, mask_rows), reference.apply_token_bitmask(logits, bitmask, mask_rows))
    floor_bytes = 2 * logits.numel() * 4 + bitmask.numel() * 4
    times = {"reference_us": time_us(lambda: reference.apply_token_bitmask(logits, bitmask, mask_rows), calls=20, warm=3),
             "kernel_us": time_us(lambda: apply_token_bitmask(logits, bitmask, mask_rows), calls=20, warm=3),
             "copy_us": time_us(lambda: logits.clone(), calls=20, warm=3)}
    return {"rows": rows, "held_rows": len(held), "reference_bits": same,
            **{k: round(v, 1) for k, v in times.items()}, "floor_us": round(floor_bytes / BANDWIDTH * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,32,128")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {**results_io.header(), "vocab": VOCAB, "cases": []}
    for rows in (int(r) for r in args.rows.split(",")):
        for held_every in (1, 2) if rows > 1 else (1,):
            result["cases"].append(case(rows, held_every))
            results_io.write(args.out, result)
    print(f"{'B':>4} {'held':>5} {'bits':>5} {'ref us':>8} {'kernel us':>10} {'copy us':>8} {'floor us':>9}")
    for c in result["cases"]:
        print(f"{c['rows']:>4} {c['held_rows']:>5} {str(c['reference_bits']):>5} {c['reference_us']:>8} "
              f"{c['kernel_us']:>10} {c['copy_us']:>8} {c['floor_us']:>9}")


if __name__ == "__main__":
    main()
