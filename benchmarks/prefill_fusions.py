"""Two fusions of a long prefill pass, each against the kernels it replaces, bf16, on one GPU.

    python benchmarks/prefill_fusions.py --tokens 8192,32768 --out benchmarks/results/prefill_fusions.json

- The GDN output's gated RMSNorm in the chunked prefill's output kernel (`chunk_gdn(output_norm=...)`)
  against the output kernel and the gated norm's own kernel, the chunk kernels timed together
  (Qwen3.5 GDN shape: 16 key heads, 32 value heads of 128); also the output kernel at 8 warps, fused and
  unfused. Error of the fused output against the unfused one.
- A block's output projection added into the residual by cuBLAS (`kernels.PendingProjection`:
  `residual.addmm_` then the norm) against the GEMM writing its result and the add-norm kernel
  summing it with the residual (`--shape 9b`: the 4096 x 4096 out projection and the 4096 x 12288 down
  projection; `--shape 35b-a3b`: the 2048 x 4096 out projections), at `--projection-tokens` rows. Error
  of the sum against the unfused one.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernels_check import time_graph_us  # noqa: E402
from deltaserve import kernels  # noqa: E402
from deltaserve.kernels.gdn.triton_chunk import chunk_gdn  # noqa: E402
from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm  # noqa: E402
from deltaserve.kernels.norm.triton_rms_norm import add_rms_norm, rms_norm  # noqa: E402

HK, HV, DK, DV = 16, 32, 128, 128
# (hidden size, [(name, K)]): the projections into each shape's residual
PROJECTIONS = {"9b": (4096, [("out / o_proj", 4096), ("down", 12288)]),
               "35b-a3b": (2048, [("out / o_proj", 4096)])}  # its experts' down projections are the MoE's own
DEVICE = "cuda"


def gdn_inputs(tokens: int, prompts: int):
    """The layer's views: q, k, v out of the conv's output, z, a, b out of the projection's row."""
    dev, bf16 = DEVICE, torch.bfloat16
    mixed = torch.randn(tokens, 2 * HK * DK + HV * DV, device=dev, dtype=bf16)
    q, k, v = mixed.split([HK * DK, HK * DK, HV * DV], -1)
    projected = torch.randn(tokens, HV * DV + 2 * HV, device=dev, dtype=bf16)
    z, b, a = projected.split([HV * DV, HV, HV], -1)
    A_log, dt_bias = torch.randn(HV, device=dev) * 0.5, torch.randn(HV, device=dev)
    h_pool = torch.randn(prompts + 1, HV, DK, DV, device=dev) * 0.1
    starts = torch.arange(prompts + 1, device=dev, dtype=torch.int32) * (tokens // prompts)
    slots = torch.arange(prompts, device=dev, dtype=torch.int32)
    norm = kernels.GatedNorm(z.reshape(tokens, HV, DV), torch.randn(DV, device=dev, dtype=bf16), 1e-6)
    return ((q.reshape(tokens, HK, DK), k.reshape(tokens, HK, DK), v.reshape(tokens, HV, DV), a, b, A_log, dt_bias,
             h_pool, slots, starts), norm)


def gdn_rows(tokens: int, prompts: int) -> dict:
    args, norm = gdn_inputs(tokens, prompts)
    pool = args[7]
    start = pool.clone()

    def run(**options):
        pool.copy_(start)
        return chunk_gdn(*args, **options)

    unfused = gated_rms_norm(run(), *norm)
    fused = run(output_norm=norm, fuse_norm=True)
    diff = (fused.float() - unfused.float()).abs()
    row = {"tokens": tokens, "prompts": prompts,
           "max_abs_diff": round(diff.max().item(), 5),
           "rel_err": round((diff.norm() / unfused.float().norm()).item(), 6),
           "bytes_identical": round((fused == unfused).float().mean().item(), 4)}
    row["unfused_us"] = round(time_graph_us(lambda: gated_rms_norm(chunk_gdn(*args), *norm), calls=3), 1)
    row["unfused_8_warps_us"] = round(time_graph_us(lambda: gated_rms_norm(chunk_gdn(*args, output={"warps": 8}), *norm),
                                                    calls=3), 1)
    row["fused_us"] = round(time_graph_us(lambda: chunk_gdn(*args, output_norm=norm, fuse_norm=True), calls=3), 1)
    row["fused_8_warps_us"] = round(time_graph_us(lambda: chunk_gdn(*args, output_norm=norm, fuse_norm=True,
                                                                                output={"warps": 8}),
                                                  calls=3), 1)
    row["norm_alone_us"] = round(time_graph_us(lambda: gated_rms_norm(unfused, *norm), calls=3), 1)
    return row


def projection_rows(tokens: int, shape: str) -> list[dict]:
    rows = []
    hidden, projections = PROJECTIONS[shape]
    for name, k in projections:
        dev, bf16 = DEVICE, torch.bfloat16
        x = torch.randn(tokens, k, device=dev, dtype=bf16)
        w = torch.randn(hidden, k, device=dev, dtype=bf16) * k**-0.5
        residual = torch.randn(tokens, hidden, device=dev, dtype=bf16)
        weight = torch.randn(hidden, device=dev, dtype=bf16)
        _, unfused = add_rms_norm(kernels.linear(x, w), residual, weight, 1e-6)
        fused = kernels.PendingProjection(x, w).added_to(residual.clone())
        diff = (fused.float() - unfused.float()).abs()
        stream = residual.clone()
        row = {"shape": shape, "projection": name, "tokens": tokens, "N": hidden, "K": k,
               "max_abs_diff": round(diff.max().item(), 5),
               "rel_err": round((diff.norm() / unfused.float().norm()).item(), 6),
               "unfused_us": round(time_graph_us(lambda: add_rms_norm(kernels.linear(x, w), residual, weight, 1e-6),
                                                 calls=3), 1),
               "fused_us": round(time_graph_us(lambda: rms_norm(stream.addmm_(x, w.T), weight, 1e-6), calls=3), 1),
               "gemm_alone_us": round(time_graph_us(lambda: kernels.linear(x, w), calls=3), 1),
               "addmm_alone_us": round(time_graph_us(lambda: stream.addmm_(x, w.T), calls=3), 1)}
        rows.append(row)
    return rows


def counts(text: str) -> list[int]:
    """"8192,32768" -> [8192, 32768]; an empty list times nothing."""
    return [int(t) for t in text.split(",") if t]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="8192,32768")
    ap.add_argument("--prompts", default="1", help="the GDN rows' prompts per pass (equal lengths)")
    ap.add_argument("--projection-tokens", default=None, help="the projections' rows (default: --tokens)")
    ap.add_argument("--shape", default="9b", help="the projections' shapes: " + ", ".join(PROJECTIONS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {**results_io.header(), "gdn_output_norm": [], "residual_projection": []}
    for tokens in counts(args.tokens):
        for prompts in counts(args.prompts):
            result["gdn_output_norm"].append(row := gdn_rows(tokens, prompts))
            print(row, flush=True)
    for tokens in counts(args.tokens if args.projection_tokens is None else args.projection_tokens):
        for shape in args.shape.split(","):
            for row in projection_rows(tokens, shape):
                result["residual_projection"].append(row)
                print(row, flush=True)
    results_io.write(args.out, result)


if __name__ == "__main__":
    main()
