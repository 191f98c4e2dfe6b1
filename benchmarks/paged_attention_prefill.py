"""Paged attention over prefill chunks, the default plan against tile configs, with and without the
unmasked interior walk: time per call (CUDA-graph replay), achieved TFLOP/s, and the error against the
fp32 reference (against the default plan's output where the reference's scores would not fit).

    python benchmarks/paged_attention_prefill.py --out benchmarks/results/paged_attention_prefill.json

Cases (rows: a chunk's tokens): the chunks a long prompt meets under the server's default 2048-token step
(2048 rows over 0, 2048, 6144 and 30720 cached keys: the first, second, fourth and sixteenth chunks of a 32k
prompt), fresh prompts of 8192, 4096, 1024, 512 and 256 tokens, closed batches' prompts (128 of 128 tokens, 32
of 256, 16 of 64), a prefix-cache hit's 80-row tail over 8240 keys, and 64 chunks of 32 rows over 96 cached
keys. Shapes: Qwen3.5-9B's attention (16 query heads, 4 KV heads) and Qwen3.5-35B-A3B's (2 KV heads), head
dim 256, bf16, 16-token pages. cuDNN's fresh-prompt attention (torch's sdpa) on the fresh cases is the
yardstick.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernels_check import HEAD_DIM, HEADS, attention_inputs, f32, rel_err, time_graph_us  # noqa: E402
from deltaserve.kernels.attention import reference as attn_ref  # noqa: E402
from deltaserve.kernels.attention.fresh_prefill import causal_attention_fresh  # noqa: E402
from deltaserve.kernels.attention.triton_paged_attention import paged_attention  # noqa: E402

# (block_m, block_n, num_warps, num_stages, interior)
TILES = [(64, 32, 8, 2, False), (64, 32, 4, 2, True), (64, 64, 4, 2, True), (64, 64, 4, 3, True),
         (128, 32, 8, 2, True), (128, 64, 8, 2, False), (128, 64, 8, 2, True), (128, 64, 8, 3, True)]
# 128 x 128 tiles at head dim 256 ask for 320 KiB of shared memory (paged_attention_prefill.json), over sm_90's 227.
# (label, cached keys a sequence, rows a sequence, sequences)
CASES = [("2048 rows fresh", 0, 2048, 1), ("2048 rows over 2048", 2048, 2048, 1),
         ("2048 rows over 6144", 6144, 2048, 1), ("2048 rows over 30720", 30720, 2048, 1),
         ("1024 rows fresh", 0, 1024, 1), ("128 x 128 rows fresh", 0, 128, 128), ("80 rows over 8240", 8240, 80, 1),
         ("256 rows fresh", 0, 256, 1), ("512 rows fresh", 0, 512, 1), ("32 x 256 rows fresh", 0, 256, 32),
         ("16 x 64 rows fresh", 0, 64, 16), ("64 x 32 rows over 96", 96, 32, 64), ("4096 rows fresh", 0, 4096, 1),
         ("8192 rows fresh", 0, 8192, 1)]
REFERENCE_MAX_SCORES = 1 << 28  # the reference holds every score in fp32


def flops(cached: int, rows: int, seqs: int) -> float:
    return 4 * seqs * (rows * cached + rows * (rows + 1) / 2) * HEADS * HEAD_DIM


def case(label: str, cached: int, rows: int, seqs: int, kv_heads: int, tiles) -> dict:
    inputs = attention_inputs([cached + rows] * seqs, [rows] * seqs, kv_heads=kv_heads)
    q, k_cache, v_cache, starts, lens, tables, scale = inputs
    work = flops(cached, rows, seqs)
    run = lambda **tile: paged_attention(*inputs, max_query_len=rows, **tile)  # noqa: E731
    default = run()
    if seqs * rows * (cached + rows) * HEADS <= REFERENCE_MAX_SCORES:
        expected, against = attn_ref.paged_attention(*f32(q, k_cache, v_cache), starts, lens, tables, scale), "fp32"
    else:
        expected, against = default, "default"
    res = {"case": label, "kv_heads": kv_heads, "error_against": against, "default_rel_err": rel_err(default, expected)}
    res["default_us"] = round(time_graph_us(run, calls=3, replays=5), 1)
    res["default_tflops"] = round(work / res["default_us"] / 1e6, 1)
    if cached == 0 and seqs == 1:
        dense_k, dense_v = (torch.randn(rows, kv_heads, HEAD_DIM, dtype=q.dtype, device=q.device) for _ in range(2))
        sdpa = lambda: causal_attention_fresh(q, dense_k, dense_v, [0, rows], scale)  # noqa: E731
        res["cudnn_us"] = round(time_graph_us(sdpa, calls=3, replays=5), 1)
        res["cudnn_tflops"] = round(work / res["cudnn_us"] / 1e6, 1)
    res["configs"] = []
    for block_m, block_n, warps, stages, interior in tiles:
        tile = dict(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, interior=interior)
        row = dict(tile)
        try:
            row["rel_err"] = rel_err(run(**tile), expected)
            row["us"] = round(time_graph_us(lambda: run(**tile), calls=3, replays=5), 1)
            row["tflops"] = round(work / row["us"] / 1e6, 1)
        except Exception as exc:  # a config that does not compile (shared memory) is a result too
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        res["configs"].append(row)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--kv-heads", default="4,2")
    ap.add_argument("--cases", default="", help="comma-separated case indices (default: all)")
    ap.add_argument("--tiles", default="", help="comma-separated indices into TILES (default: all)")
    args = ap.parse_args()
    result = {**results_io.header(), "cases": []}
    picked = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
    for kv_heads in (int(h) for h in args.kv_heads.split(",")):
        for label, cached, rows, seqs in picked:
            tiles = [TILES[int(i)] for i in args.tiles.split(",")] if args.tiles else TILES
            res = case(label, cached, rows, seqs, kv_heads, tiles)
            result["cases"].append(res)
            results_io.write(args.out, result)
            best = min((c for c in res["configs"] if "us" in c), key=lambda c: c["us"])
            print(f"kv{kv_heads} {label:24s} default {res['default_us']:8.1f} us {res['default_tflops']:6.1f} TF/s"
                  f" | best {best['us']:8.1f} us {best['tflops']:6.1f} TF/s "
                  f"{(best['block_m'], best['block_n'], best['num_warps'], best['num_stages'], best['interior'])}"
                  + (f" | cudnn {res['cudnn_us']:7.1f} us {res['cudnn_tflops']:6.1f}" if "cudnn_us" in res else ""),
                  flush=True)
            for c in res["configs"]:
                print("    ", {k: c[k] for k in c if k not in ("rel_err",)},
                      f"err {c.get('rel_err', float('nan')):.2e}", flush=True)


if __name__ == "__main__":
    main()
