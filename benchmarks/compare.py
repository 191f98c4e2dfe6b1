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

# Where the time goes, from the per-kernel timings in kernels_check.json and the step times above.
NOTES = {
    "qwen3.5-9b": [
        "C=1: 5.3 ms per step against a 3.77 ms floor (0.71); 0.8 of the floor needs 4.71 ms. A decode step "
        "replays ~450 kernels (about 14 per layer); the small ones cost 1.3-3 us each (add+RMSNorm 2.0, gated "
        "RMSNorm 1.5, norm+rotary+KV store 2.4, conv1d 2.2, GDN decode 3.0, SiLU-mul 1.3), about 1 ms per step, "
        "and the host's work per step (scheduling, metadata copy, the sampled-token read-back) is not "
        "overlapped with the GPU.",
        "C>=32: 0.93-0.97x vLLM. The GDN decode kernel runs at 3.25 TB/s (165 us per layer at B=128, 24 "
        "layers = 4 ms) and the engine's per-step host work grows with the batch (about 1.5 ms at C=128 measured "
        "on the CPU) with no asynchronous scheduling to hide it.",
        "Prefill: 1.02x (8k) and 1.07x (32k) vLLM's time against the 0.9x target; the GEMMs (cuBLAS) take most "
        "of it, the GDN chunked prefill 1.3 ms per layer at 8k and 5 ms at 32k.",
    ],
    "qwen3.5-35b-a3b": [
        "C=1: 283 tok/s (3.54 ms) against the 400 tok/s target (2.5 ms) and a 1.42 ms floor. The MoE experts "
        "take 20 us per layer at one token against an 11.9 us floor (40 layers: 0.8 ms), and a step replays "
        "about 17 kernels per layer.",
        "C=64: 0.88x vLLM. At 64 tokens the MoE runs the sorted grouped GEMM: 382 us per layer against a "
        "341 us floor, 15 ms of the 22 ms step; the GDN decode and host work make up the rest.",
        "Prefill: 1.3x vLLM's time at 8k and 32k; MoE prefill runs the sorted grouped GEMM at 2.4 TB/s-equivalent "
        "(680 us per layer at 2048 tokens), below what a tensor-core grouped GEMM reaches.",
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
    c1 = next(r for r in ours["decode"] if r["concurrency"] == 1)["aggregate_tok_s"]
    return {"commit": ours["commit"], "date": ours["date"], "decode": rows, "prefill": prefill,
            "c1_tok_s": c1, "c1_target": C1_TARGET[shape], "c1_meets_target": c1 >= C1_TARGET[shape],
            "where_the_time_goes": NOTES[shape]}


def main() -> None:
    out = {shape: compare(shape) for shape in VLLM if os.path.exists(os.path.join(RESULTS, f"engine_{shape}.json"))}
    with open(os.path.join(RESULTS, "comparison.json"), "w") as f:
        json.dump(out, f, indent=1)
    for shape, data in out.items():
        print(f"{shape}: C=1 {data['c1_tok_s']} tok/s (target {data['c1_target']})")
        for r in data["decode"]:
            print(f"  C={r['concurrency']:>3}  {r['deltaserve_tok_s']:>9}  vLLM {r.get('vllm_tok_s', '-'):>7}  "
                  f"x{r.get('ratio_to_vllm', '-')}  floor {r['floor_ratio']}")
        for r in data["prefill"]:
            print(f"  prefill {r['tokens']:>6}: {r['deltaserve_s']} s  vLLM {r.get('vllm_s', '-')}  x{r.get('ratio_to_vllm', '-')}")


if __name__ == "__main__":
    main()
