"""The sampler's device paths at the Qwen3.5 vocabulary: checks, then times per call.

    python benchmarks/sampling_masks.py --out benchmarks/results/sampling_masks.json [--rows 1,32,128]
        [--floor-tiles 4096x8,8192x16]   (nucleus_floors alone with those slices and warps)

Logits: `randn` (normal, standard deviation 3) and `zipf` (a token of rank r has logit -1.1 log r, ranks
shuffled, plus normal noise of deviation 0.1: probabilities that fall as a power of the rank, as a language
model's do). Every row samples at temperature 0.8. Paths (kernels.sampling.triton_race.sample_from_logits
with each MaskPlan): `race` (temperature alone), `floors` (top-p 0.95 as the nucleus kernels' floors,
applied by the race), `topk` (top-k 20 and top-p 0.95 in every row, through torch.topk), `mixed` (the even
rows top-k 20 and top-p 0.95, the odd ones top-p 0.95 alone: torch.topk, then floors for the odd rows), and
`sort` (top-p 0.95 through the reference's sort of the vocabulary, then the race: what a batch with top-k
in some rows took before the mixed plan). `top_k_alone` / `torch_topk_alone`: the best 20 tokens of each
row by triton_top_k.top_k / torch.topk. `floors_alone`: nucleus_floors alone at its default tiles;
`floors_<slice>x<warps>`: with those tiles.
Checks on fresh logits: the rows whose kept tokens under the floors differ from the reference's
mask (expected 0, but for ties and the last bit of the sums), the share of rows where the floors and the
mixed paths sample the sort path's token (the same draws), and whether top_k's values are torch.topk's.
Times: microseconds a call over 20 calls back to back, launches included, as the engine calls them (eager,
after a decode graph).
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
from deltaserve.kernels.sampling.triton_race import race_or_argmax, sample_from_logits  # noqa: E402
from deltaserve.kernels.sampling.triton_top_k import top_k as candidates_top_k  # noqa: E402

VOCAB = 248320  # Qwen3.5's padded vocabulary
FLOORS = reference.MaskPlan(nucleus=True)
TOP_K = reference.MaskPlan(20, True, greedy_rows=False)  # as the sampler plans these batches: every row samples
MIXED = reference.MaskPlan(20, False, True, greedy_rows=False)


def logits(rows: int, kind: str) -> torch.Tensor:
    if kind == "randn":
        return torch.randn(rows, VOCAB, device="cuda") * 3
    ranks = torch.rand(rows, VOCAB, device="cuda").argsort(-1) + 1
    return -1.1 * ranks.float().log() + torch.randn(rows, VOCAB, device="cuda") * 0.1


def batch(rows: int, kind: str, top_k=None):
    """(logits, temperature, top_k, top_p, min_p, seeds) on the GPU; top_k: the rows' top-k (0 = off)."""
    cuda = dict(device="cuda")
    top_k = torch.zeros(rows, dtype=torch.int64, **cuda) if top_k is None else top_k
    return (logits(rows, kind), torch.full((rows,), 0.8, **cuda), top_k, torch.full((rows,), 0.95, **cuda),
            torch.zeros(rows, **cuda), torch.randint(0, 2**62, (rows,), dtype=torch.int64, **cuda))


def by_sort(x, temperature, top_k, top_p, min_p, seeds):
    """The reference's masks over the whole sorted row, then the race."""
    inverse = 1.0 / temperature
    masked = reference.mask_logits(x * inverse[:, None], top_k, top_p, min_p)
    return race_or_argmax(masked, torch.ones_like(inverse), seeds, temperature <= 0)


def mixed_top_k(rows: int) -> torch.Tensor:
    return torch.tensor([20 if r % 2 == 0 else 0 for r in range(rows)], device="cuda")


def check(rows: int, kind: str) -> dict:
    args = batch(rows, kind)
    x, temperature, top_k, top_p, min_p, _ = args
    inverse = 1.0 / temperature
    scaled = x * inverse[:, None]
    expected = torch.isfinite(reference.mask_logits(scaled, top_k, top_p, min_p))
    kept = reference.order_keys(scaled) >= nucleus_floors(x, inverse, top_p, min_p)[:, None]
    mixed_args = (x, temperature, mixed_top_k(rows), top_p, min_p, args[5])
    return {"rows": rows, "logits": kind, "rows_kept_differently": int((kept != expected).any(1).sum()),
            "kept_tokens_mean": round(float(expected.sum(1).float().mean()), 1),
            "floors_same_token_share": round(float((sample_from_logits(*args, mask=FLOORS) == by_sort(*args))
                                                   .float().mean()), 4),
            "mixed_same_token_share": round(float((sample_from_logits(*mixed_args, mask=MIXED)
                                                   == by_sort(*mixed_args)).float().mean()), 4),
            "top_k_values_equal": bool(torch.equal(candidates_top_k(x, 20)[0], x.topk(20, dim=-1).values))}


def timings(rows: int, kind: str, floor_tiles: list[tuple[int, int]]) -> dict:
    args = batch(rows, kind)
    top_k_args = batch(rows, kind, torch.full((rows,), 20, device="cuda"))
    mixed_args = batch(rows, kind, mixed_top_k(rows))
    paths = {"race": lambda: sample_from_logits(*args, mask=reference.MaskPlan()),
             "floors": lambda: sample_from_logits(*args, mask=FLOORS),
             "topk": lambda: sample_from_logits(*top_k_args, mask=TOP_K),
             "mixed": lambda: sample_from_logits(*mixed_args, mask=MIXED),
             "sort": lambda: by_sort(*args)}
    x, temperature, _, top_p, min_p, _ = args
    inverse = 1.0 / temperature
    paths["floors_alone"] = lambda: nucleus_floors(x, inverse, top_p, min_p)
    paths["top_k_alone"] = lambda: candidates_top_k(x, 20)
    paths["torch_topk_alone"] = lambda: x.topk(20, dim=-1)
    for slice_, warps in floor_tiles:
        paths[f"floors_{slice_}x{warps}"] = (lambda s=slice_, w=warps: nucleus_floors(
            x, inverse, top_p, min_p, slice_=s, num_warps=w))
    times = {name: round(time_us(fn, calls=20, warm=3), 1) for name, fn in paths.items()}
    return {"rows": rows, "logits": kind, **times}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,32,128")
    ap.add_argument("--floor-tiles", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    floor_tiles = [tuple(int(n) for n in t.split("x")) for t in args.floor_tiles.split(",") if t]
    result = {**results_io.header(), "vocab": VOCAB, "checks": [], "us_per_call": []}
    for kind in ("randn", "zipf"):
        for rows in (int(r) for r in args.rows.split(",")):
            result["checks"].append(check(rows, kind))
            result["us_per_call"].append(timings(rows, kind, floor_tiles))
            results_io.write(args.out, result)
    for c, t in zip(result["checks"], result["us_per_call"]):
        print(c)
        print(t)


if __name__ == "__main__":
    main()
