"""The sampler's device paths at the Qwen3.5 vocabulary: checks, then times per call.

    python benchmarks/sampling_masks.py --out benchmarks/results/sampling_masks.json [--rows 1,32,128]

Paths (kernels.sampling.triton_race.sample_from_logits with each MaskPlan): `race` (temperature alone),
`sort` (top-p 0.95 through the reference's sort of the vocabulary and the race), `topk` (top-k 20 and
top-p 0.95 through torch.topk), `floors` (top-p 0.95 as the nucleus kernels' floors, applied by the race).
Checks on fresh random logits: the rows whose kept tokens under the floors differ from the reference's mask
(expected 0) and the share of rows where the floors path samples the sort path's token (the same draws;
1.0 unless the GPU rounds the scaled logits differently). Times: microseconds a call over 20 calls back to
back, launches included, as the engine calls them (eager, after a decode graph).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernel_times import time_us  # noqa: E402
from deltaserve.kernels.sampling import reference  # noqa: E402
from deltaserve.kernels.sampling.triton_nucleus import nucleus_floors  # noqa: E402
from deltaserve.kernels.sampling.triton_race import sample_from_logits  # noqa: E402

VOCAB = 248320  # Qwen3.5's padded vocabulary


def batch(rows: int, top_k: int = -1):
    """(logits, temperature, top_k, top_p, min_p, seeds) on the GPU."""
    cuda = dict(device="cuda")
    return (torch.randn(rows, VOCAB, **cuda) * 3, torch.full((rows,), 0.8, **cuda),
            torch.full((rows,), max(top_k, 0), dtype=torch.int64, **cuda), torch.full((rows,), 0.95, **cuda),
            torch.zeros(rows, **cuda), torch.randint(0, 2**62, (rows,), dtype=torch.int64, **cuda))


def check(rows: int) -> dict:
    logits, temperature, top_k, top_p, min_p, seeds = args = batch(rows)
    inverse = 1.0 / temperature
    scaled = logits * inverse[:, None]
    kept = reference.order_keys(scaled) >= nucleus_floors(logits, inverse, top_p, min_p)[:, None]
    expected = torch.isfinite(reference.mask_logits(scaled, top_k, top_p, min_p))
    by_floors = sample_from_logits(*args, mask=reference.MaskPlan(VOCAB, False))
    by_sort = sample_from_logits(*args, mask=reference.MaskPlan(VOCAB, True))
    return {"rows": rows, "rows_kept_differently": int((kept != expected).any(1).sum()),
            "kept_tokens_mean": round(float(expected.sum(1).float().mean()), 1),
            "same_token_share": round(float((by_floors == by_sort).float().mean()), 4)}


def timings(rows: int) -> dict:
    args, top_k_args = batch(rows), batch(rows, top_k=20)
    plans = {"race": (args, reference.MaskPlan()), "sort": (args, reference.MaskPlan(VOCAB, True)),
             "topk": (top_k_args, reference.MaskPlan(20, True)), "floors": (args, reference.MaskPlan(VOCAB, False))}
    return {"rows": rows, **{name: round(time_us(lambda a=a, m=m: sample_from_logits(*a, mask=m), calls=20, warm=3), 1)
                             for name, (a, m) in plans.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,32,128")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {**results_io.header(), "vocab": VOCAB, "checks": [], "us_per_call": []}
    for rows in (int(r) for r in args.rows.split(",")):
        result["checks"].append(check(rows))
        result["us_per_call"].append(timings(rows))
        results_io.write(args.out, result)
    for c, t in zip(result["checks"], result["us_per_call"]):
        print(c)
        print(t)


if __name__ == "__main__":
    main()
