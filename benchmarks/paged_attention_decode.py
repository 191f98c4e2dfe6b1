"""Paged attention at decode (one token a sequence), the default plan against tile and split configs:
time per call with the K/V out of L2, error against the fp32 reference, and the ratio to the floor
(the K/V bytes read over 4.24 TB/s).

    python benchmarks/paged_attention_decode.py --out benchmarks/results/paged_attention_decode.json

Each timed graph calls the op on enough distinct K/V pools (at least 256 MB in all) that no call reads
another's K/V from the 50 MB L2, as in the engine, where a layer's weights pass through L2 between two
attention calls: one pool called over and over reads a 25 MB K/V set from L2 and times 2-4x faster.
Shapes: Qwen3.5-9B's attention (16 query heads, 4 KV heads) and Qwen3.5-35B-A3B's (2 KV heads), head
dim 256, bf16, 16-token pages; 256 keys is the middle of a closed batch of 128-token prompts and 256
generated tokens.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.kernels_check import HEAD_DIM, attention_inputs, f32, rel_err, time_graph_us  # noqa: E402
from deltaserve.kernels.attention import reference as attn_ref  # noqa: E402

BANDWIDTH = 4.24e12
POOL_BYTES = 256 << 20

# (block_n, num_warps, num_stages) x splits
TILES = [(16, 4, 3), (32, 4, 2), (32, 4, 3), (32, 2, 2), (64, 4, 2), (64, 4, 1), (16, 2, 4)]
SPLITS = [1, 2, 4, 8]


def time_rotated_us(calls, replays: int = 10) -> float:
    """Microseconds a call, from graph replay of one call on each input set in turn."""
    return time_graph_us(lambda: [call() for call in calls], calls=1, replays=replays) / len(calls)


def case(batch: int, ctx: int, kv_heads: int, tiles: list[dict]) -> dict:
    from deltaserve.kernels.attention.triton_paged_attention import launch_plan, paged_attention
    from deltaserve.kernels.sm_count import num_sms

    kv_bytes = batch * ctx * kv_heads * HEAD_DIM * 2 * 2
    sets = [attention_inputs([ctx] * batch, [1] * batch, kv_heads=kv_heads)
            for _ in range(max(2, min(32, -(-POOL_BYTES // kv_bytes))))]
    q, k_cache, v_cache, starts, lens, tables, scale = sets[0]
    expected = attn_ref.paged_attention(*f32(q, k_cache, v_cache), starts, lens, tables, scale)
    plan = launch_plan(batch, batch, 1, q.shape[1] // kv_heads, kv_heads, HEAD_DIM, num_sms(q.device))
    floor_us = kv_bytes / BANDWIDTH * 1e6
    row = {"name": f"decode_kv{kv_heads}_B{batch}_ctx{ctx}", "input_sets": len(sets), "floor_us": round(floor_us, 2),
           "default": {"block_n": plan.block_n, "splits": plan.splits}}
    rows = []
    for tile in [{}] + tiles:
        cfg = dict(tile)
        try:
            cfg["rel_err"] = rel_err(paged_attention(*sets[0], max_query_len=1, **tile), expected)
            cfg["us"] = round(time_rotated_us([lambda s=s: paged_attention(*s, max_query_len=1, **tile)
                                                for s in sets]), 2)
            cfg["floor_ratio"] = round(floor_us / cfg["us"], 3)
        except Exception as exc:  # a config the compiler refuses (shared memory) is reported, not fatal
            cfg["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        rows.append(cfg)
    row["default"].update(rows[0])
    row["configs"] = rows[1:]
    best = min((r for r in rows[1:] if "us" in r), key=lambda r: r["us"], default=None)
    row["best"] = best
    best_tile = best and {k: best[k] for k in ("block_n", "num_warps", "num_stages", "splits")}
    print(f"{row['name']:28s} floor {floor_us:7.2f} default {rows[0].get('us')} best {best and best['us']} {best_tile}",
          flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="32,64,128")
    ap.add_argument("--ctx", default="256,2048")
    ap.add_argument("--kv-heads", default="4,2")
    ap.add_argument("--splits", default=",".join(map(str, SPLITS)))
    args = ap.parse_args()
    torch.manual_seed(0)
    tiles = [{"block_m": 16, "block_n": bn, "num_warps": warps, "num_stages": stages, "splits": splits}
             for bn, warps, stages in TILES for splits in map(int, args.splits.split(","))]
    cases = []
    for kv_heads in map(int, args.kv_heads.split(",")):
        for batch in map(int, args.batches.split(",")):
            for ctx in map(int, args.ctx.split(",")):
                cases.append(case(batch, ctx, kv_heads, tiles))
                results_io.write(args.out, dict(results_io.header(), bandwidth=BANDWIDTH, cases=cases))


if __name__ == "__main__":
    main()
