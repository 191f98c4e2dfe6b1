"""Sets deltaserve's engine results beside vLLM 0.24.0 on the same H200 and the issue's targets.

    python benchmarks/compare.py   # reads benchmarks/results/engine_*.json, writes comparison.json

The vLLM figures are the ones measured on this card on 2026-11-29 with the same shapes and the same
instrument (closed batches, 128-token prompts, 256 generated tokens; `../shared/peers/vllm/`); where
both a run with a decode warm-up and one without exist, the faster is used.
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

VLLM = {
    "qwen3.5-9b": {"decode": {1: 185.5, 2: 237.5, 4: 698, 8: 1365, 16: 2596, 32: 4777, 64: 8128, 128: 11953},
                   "prefill": {8192: 0.214, 32768: 0.912}},
    "qwen3.5-35b-a3b": {"decode": {1: 232.7, 32: 1757, 64: 3312, 128: 4512},
                        "prefill": {8192: 0.147, 32768: 0.631}},
}
C1_TARGET = {"qwen3.5-9b": 215.0, "qwen3.5-35b-a3b": 400.0}

# Where the time goes, from benchmarks/results: profile_steps.py (kernels of the decode graphs, per step),
# kernels_check*.json and skinny_gemm.json (per-kernel times), and the step times above.
NOTES = {
    "qwen3.5-9b": [
        "C=1: 4.63 ms per step against the 3.77 ms floor (0.815 of it), 216.2 tok/s: the target is met. The "
        "projections are most of the step: 4.39 ms of cuBLAS at about 85% of the copy bandwidth before the "
        "skinny GEMM (split-K kernels and their reductions for the down, GDN in/out and o_proj weights), "
        "which reads those faster (26.5 vs 29.4 us for the 4096x12288 down projection, 7.8 vs 10.6 us for "
        "4096x4096, 442 vs 473 us for the LM head; skinny_gemm.json); about 300 small kernels add 0.5 ms. "
        "The host's work is hidden by asynchronous scheduling: 0.05 ms per step outside the graph.",
        "C=2-16: 1.13-1.78x vLLM.",
        "C=32-128: 1.06-1.07x vLLM (against 4777 / 8128 / 11953; 1.11x against the 4608 the issue quotes at "
        "C=32). At C=64 the graph's kernels take 7.3 ms against a 5.4 ms floor: the GEMMs 4.6 ms (81% of "
        "their floor), the GDN recurrent decode 1.85 ms (24 layers reading and writing 64 fp32 states, 82% "
        "of the bandwidth), attention, norms and conv1d the rest.",
        "Prefill: 1.01x (8k) and 1.07x (32k) vLLM's time against the 0.9x target, at about 600 TFLOP/s; the "
        "GEMMs (cuBLAS) take most of it, the GDN chunked prefill about 1.3 ms per layer at 8k.",
    ],
    "qwen3.5-35b-a3b": [
        "C=1: 335.4 tok/s (2.98 ms) against the 400 tok/s target (2.5 ms) and a 1.42 ms floor; 1.44x vLLM. "
        "A step replays about 12 kernels per layer over 40 layers; the MoE direct path (8 routed experts and "
        "the shared one stacked as a ninth) measured 20 us per layer at one token against a 12 us floor "
        "before the shared expert was folded in.",
        "C=64: 0.94x vLLM. At 64 tokens the MoE runs the sorted grouped GEMM, about 380 us per layer against "
        "the 326 us of reading the touched experts (kernels_check_moe_sorted_tiles.json, every tile and grid "
        "order within 377-390 us): 15 ms of the 20.5 ms step.",
        "C=32 and C=128: 1.21x and 1.11x vLLM.",
        "Prefill: 1.05x vLLM's time at 8k (0.155 s) and 32k (0.664 s) against the 0.9x target. At 8k the "
        "grouped expert GEMMs take about 1.3 ms per layer (315 TFLOP/s with the column tiles on the grid's "
        "fast axis), the GDN chunked prefill about 1.3 ms per layer, then the GDN input GEMM and attention.",
    ],
}


def compare(shape: str) -> dict:
    ours = json.load(open(os.path.join(RESULTS, f"engine_{shape}.json")))
    peer = VLLM[shape]
    rows = []
    for row in ours["decode"]:
        c = row["concurrency"]
        entry = {"concurrency": c, "deltaserve_tok_s": row["aggregate_tok_s"], "floor_ratio": row["floor_ratio"]}
        if c in peer["decode"]:
            entry["vllm_tok_s"] = peer["decode"][c]
            entry["ratio_to_vllm"] = round(row["aggregate_tok_s"] / peer["decode"][c], 3)
            entry["meets_1_1x"] = entry["ratio_to_vllm"] >= 1.1
        rows.append(entry)
    prefill = []
    for row in ours["prefill"]:
        entry = {"tokens": row["tokens"], "deltaserve_s": row["ttft_s"]}
        if row["tokens"] in peer["prefill"]:
            entry["vllm_s"] = peer["prefill"][row["tokens"]]
            entry["ratio_to_vllm"] = round(row["ttft_s"] / peer["prefill"][row["tokens"]], 3)
            entry["meets_0_9x"] = entry["ratio_to_vllm"] <= 0.9
        prefill.append(entry)
    c1_row = next(r for r in ours["decode"] if r["concurrency"] == 1)
    c1 = c1_row["aggregate_tok_s"]
    return {"commit": ours["commit"], "date": ours["date"], "decode": rows, "prefill": prefill,
            "c1_tok_s": c1, "c1_floor_ratio": c1_row["floor_ratio"], "c1_target": C1_TARGET[shape],
            "c1_meets_target": c1 >= C1_TARGET[shape], "where_the_time_goes": NOTES[shape]}


PREFIX_TARGET = 10.0  # warm follow-up turn at least this many times faster than cold
PREFIX_NOTES = [
    "The warm follow-up turn recomputes 80 tokens (the new 64-token message and 16 tokens of the reply) in "
    "two passes: it restores the snapshot saved during decode at 8240 and must stop at the request's replay "
    "point, 8304, so that sending it again replays byte for byte. Both passes run eagerly and are bound by "
    "the host: about 1600 kernel launches, 40 and 28 ms of wall time (profile_qwen3.5-35b-a3b.json), for "
    "30 ms of kernels.",
    "Those 30 ms are close to what the warm turn must read: 64 tokens touch about 221 of the 256 experts in "
    "each layer and 16 tokens about 101, 19.3 ms of expert weights at 4.24 TB/s, and the expert GEMMs took "
    "19.8 ms. The cold turn is one 8192-token pass (about 0.16 s, as fast as a plain prefill) plus short "
    "passes, 0.196 s: a warm turn at its GPU time alone would be about 6.5x faster, and 10x asks for "
    "about 20 ms, the expert weight reads alone. Getting closer needs the two short passes replayed as CUDA "
    "graphs (the host's launches gone) and, for 10x, one pass instead of two.",
    "An earlier figure of 6.6x came from a cold turn that included compiling kernels for its pass lengths; "
    "the benchmark's warm-up now runs the cold turn as well.",
]


def compare_prefix_cache(shape: str) -> dict:
    ours = json.load(open(os.path.join(RESULTS, f"prefix_cache_{shape}.json")))
    turn = ours["follow_up_turn"]
    return {"commit": ours["commit"], "date": ours["date"], "warm_ttft_s": turn["warm_ttft_s"],
            "cold_ttft_s": turn["cold_ttft_s"], "speedup": turn["speedup"], "target": PREFIX_TARGET,
            "meets_target": turn["speedup"] >= PREFIX_TARGET, "warm_recomputed_tokens": turn["warm_recomputed_tokens"],
            "shared_prefix_speedup": ours["shared_prefix"]["speedup"], "where_the_time_goes": PREFIX_NOTES}


def main() -> None:
    out = {shape: compare(shape) for shape in VLLM if os.path.exists(os.path.join(RESULTS, f"engine_{shape}.json"))}
    for shape in VLLM:
        if os.path.exists(os.path.join(RESULTS, f"prefix_cache_{shape}.json")):
            out[f"prefix_cache_{shape}"] = compare_prefix_cache(shape)
    with open(os.path.join(RESULTS, "comparison.json"), "w") as f:
        json.dump(out, f, indent=1)
    for shape, data in out.items():
        if shape.startswith("prefix_cache"):
            print(f"{shape}: warm {data['warm_ttft_s']} s, cold {data['cold_ttft_s']} s, x{data['speedup']}")
            continue
        print(f"{shape}: C=1 {data['c1_tok_s']} tok/s (target {data['c1_target']})")
        for r in data["decode"]:
            print(f"  C={r['concurrency']:>3}  {r['deltaserve_tok_s']:>9}  vLLM {r.get('vllm_tok_s', '-'):>7}  "
                  f"x{r.get('ratio_to_vllm', '-')}  floor {r['floor_ratio']}")
        for r in data["prefill"]:
            print(f"  prefill {r['tokens']:>6}: {r['deltaserve_s']} s  vLLM {r.get('vllm_s', '-')}  x{r.get('ratio_to_vllm', '-')}")


if __name__ == "__main__":
    main()
