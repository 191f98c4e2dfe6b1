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
            "c1_tok_s": c1, "c1_target": C1_TARGET[shape], "c1_meets_target": c1 >= C1_TARGET[shape]}


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
