"""Device time of each chunked-GDN prefill kernel, for one or more source trees in one command.

    python benchmarks/gdn_prefill_kernels.py --trees .base=19d5b97,.=edcc4d4 --rounds 2 --out results/x.json

Each (round, tree) runs in a fresh process that imports deltaserve from that tree, so commits are
compared on the same card, alternated. The inputs are laid out as the engine's are: q, k and v strided
views of one conv1d output, a and b of the input projection's. Per kernel: the profiler's mean over 5 calls.
Its imports (kernel_times, results_io) hold no deltaserve: kernels_check would put its own tree's first
on the path.
"""

import argparse
import json
import os
import subprocess
import sys

import results_io  # this directory's modules: first on the path of a script
from kernel_times import per_kernel_us

HK, HV, DK, DV = 16, 32, 128, 128  # the Qwen3.5 GDN shape
IN_PROJ = 2 * HK * DK + 2 * HV * DV  # the projection's rows before b and a


def packed_inputs(tokens: int, seqs: int):
    import torch

    dev = "cuda"
    mixed = torch.randn(tokens, 2 * HK * DK + HV * DV, device=dev, dtype=torch.bfloat16)
    q, k, v = mixed.split([HK * DK, HK * DK, HV * DV], -1)
    proj = torch.randn(tokens, IN_PROJ + 2 * HV, device=dev, dtype=torch.bfloat16)
    b, a = proj[:, IN_PROJ:].split([HV, HV], -1)
    A_log, dt_bias = torch.randn(HV, device=dev) * 0.5, torch.randn(HV, device=dev)
    pool = torch.randn(seqs + 2, HV, DK, DV, device=dev) * 0.1
    slots = torch.arange(seqs, device=dev, dtype=torch.int32) + 1
    starts = torch.arange(seqs + 1, device=dev, dtype=torch.int32) * (tokens // seqs)
    return (q.reshape(tokens, HK, DK), k.reshape(tokens, HK, DK), v.reshape(tokens, HV, DV), a, b, A_log, dt_bias,
            pool, slots, starts)


def rel_errors(chunk_gdn, inputs) -> dict:
    """max |kernel - reference| / max |reference| of the output and the written states, against the fp32
    reference on fp32 copies of the same inputs."""
    from deltaserve.kernels.gdn import reference

    q, k, v, a, b, A_log, dt_bias, pool, slots, starts = inputs
    ours, ref_pool = pool.clone(), pool.clone()
    out = chunk_gdn(q, k, v, a, b, A_log, dt_bias, ours, slots, starts)
    expected = reference.chunk_gated_delta_rule(*(x.float() for x in (q, k, v, a, b)), A_log, dt_bias, ref_pool,
                                                slots.long(), starts)

    def rel(x, y):
        return float((x.float() - y).abs().max() / y.abs().max())

    return {"rel_err_out": rel(out, expected), "rel_err_state": rel(ours, ref_pool), "digest": digest(out, ours)}


def digest(*tensors) -> str:
    """A hash of the tensors' bytes: trees whose kernels compute the same thing in the same order match."""
    import hashlib

    import torch

    h = hashlib.sha1()
    for x in tensors:
        h.update(x.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def worker(tree: str, shapes: list[tuple[int, int]], errors_up_to: int) -> dict:
    sys.path.insert(0, os.path.abspath(tree))
    import torch
    from deltaserve.kernels.gdn import triton_chunk

    rows = {}
    for tokens, seqs in shapes:
        torch.manual_seed(tokens + seqs)  # every tree's worker draws the same inputs for a shape
        inputs = packed_inputs(tokens, seqs)
        q, k, v, a, b, A_log, dt_bias, pool, slots, starts = inputs
        fn = lambda: triton_chunk.chunk_gdn(q, k, v, a, b, A_log, dt_bias, pool, slots, starts)  # noqa: E731
        row = rel_errors(triton_chunk.chunk_gdn, inputs) if tokens <= errors_up_to else {}
        kernels = {name: us for name, us in per_kernel_us(fn, calls=5).items() if "_chunk_" in name}
        rows[f"{seqs}x{tokens // seqs}"] = {"kernels_us": kernels, "total_us": round(sum(kernels.values()), 1), **row}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", required=True, help="comma-separated dir=label, e.g. .base=19d5b97,.=edcc4d4")
    ap.add_argument("--shapes", default="8192x1,32768x1,16384x128", help="tokens x sequences, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--errors-up-to", type=int, default=8192,
                    help="shapes of at most this many tokens also report their errors against the fp32 reference")
    ap.add_argument("--out")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    if args.worker:
        print(json.dumps(worker(args.worker, shapes, args.errors_up_to)))
        return
    trees = [t.split("=") for t in args.trees.split(",")]
    result = {**results_io.header(), "shapes": args.shapes, "trees": dict(trees), "runs": []}
    for round_ in range(args.rounds):
        for tree, label in trees:
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", tree, "--shapes", args.shapes,
                                  "--trees", args.trees, "--errors-up-to", str(args.errors_up_to)],
                                 capture_output=True, text=True, check=True)
            rows = json.loads(run.stdout.strip().splitlines()[-1])
            result["runs"].append({"round": round_ + 1, "tree": label, "rows": rows})
            print(label, rows, flush=True)
            if args.out:
                results_io.write(args.out, result)


if __name__ == "__main__":
    main()
