"""deltaserve and vLLM on the same GPU in one command, into one result file.

    cat .peer/vllm.part* | xz -d | tar -xf - -C /tmp
    PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 \
        python3 benchmarks/side_by_side.py qwen3.5-35b-a3b --concurrency 1,32,64,128 --prefill 8192,32768 \
        --out $OUT/side_by_side_qwen3.5-35b-a3b.json

vLLM 0.24.0 is staged by ../shared/peers/vllm (its bench.py under .peer/). deltaserve's engine_bench.py
runs first; vLLM's bench.py next, in its own process (it holds 0.85 of the GPU's memory until it
exits); with `--prefill-again`, deltaserve's prefills once more after it, so that the card's drift over
the command shows. Both instruments: closed batches of C requests, 128-token prompts, 256 generated
tokens, and single long prompts' time to the first token.

Each engine keeps its GDN recurrent state in its own default dtype unless told: deltaserve fp32
(`--gdn-state-dtype`), vLLM the dtype the model's config names, the model dtype (bf16) on these shapes'
configs. `--vllm-state-dtype float32` runs vLLM through vllm_peer.py with the fp32 state that the
released checkpoints' configs name, so that the two compare at one precision.
"""

import argparse
import json
import subprocess
import sys

import results_io  # this directory's modules: first on the path of a script
from engine_ab import run_tree

VLLM_SHAPES = {"qwen3.5-9b": "qwen3.5-9b-shape", "qwen3.5-35b-a3b": "qwen3.5-35b-a3b-shape"}
INSTRUMENT = ("closed batches of C requests, 128-token prompts, 256 generated tokens. step: decode time per "
              "step after the prefill (vLLM: tpot_ms of its bench.py). closed batch: wall time of the whole "
              "batch, prefill included (vLLM: tokens / aggregate_tok_s; deltaserve: batch prefill + 255 steps); "
              "closed_batch_tok_s is the figure the issue quotes as vLLM's aggregate tok/s.")


def run_vllm(peer: str, shape: str, concurrency: str, prefill: str, log: str, state_dtype: str = "auto") -> list[dict]:
    """vLLM's bench.py in a process of its own; with a state dtype other than "auto" through vllm_peer.py,
    which hands vLLM that dtype for its GDN state as a checkpoint's `mamba_ssm_dtype` would."""
    through = [] if state_dtype == "auto" else ["benchmarks/vllm_peer.py", "--state-dtype", state_dtype]
    command = [sys.executable, *through, peer, VLLM_SHAPES[shape], concurrency] + ([prefill] if prefill else [])
    with open(log, "w") as stderr:  # vLLM's own log, for when it fails
        done = subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=stderr, text=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def decode_rows(ours: dict, theirs: list[dict], generated: int = 256) -> list[dict]:
    vllm = {r["concurrency"]: r for r in theirs if r["what"] == "vllm_decode"}
    rows = []
    for r in ours["decode"]:
        peer = vllm.get(r["concurrency"])
        if peer is None:
            continue
        our_batch_s = r["prefill_s"] + (generated - 1) * r["step_ms"] / 1e3
        rows.append({"concurrency": r["concurrency"], "deltaserve_step_ms": r["step_ms"],
                     "vllm_step_ms": round(peer["tpot_ms"], 3),
                     "step_speedup": round(peer["tpot_ms"] / r["step_ms"], 3),
                     "deltaserve_batch_prefill_s": r["prefill_s"], "vllm_batch_prefill_s": round(peer["ttft_batch_s"], 4),
                     "deltaserve_closed_batch_s": round(our_batch_s, 4),
                     "vllm_closed_batch_s": round(peer["tokens"] / peer["aggregate_tok_s"], 4),
                     "deltaserve_closed_batch_tok_s": r["closed_batch_tok_s"],
                     "vllm_closed_batch_tok_s": round(peer["aggregate_tok_s"], 1),
                     "closed_batch_speedup": round(r["closed_batch_tok_s"] / peer["aggregate_tok_s"], 3)})
    return rows


def prefill_rows(ours: dict, theirs: list[dict], again: dict | None) -> dict:
    vllm = {r["prompt_tokens"]: r["ttft_s"] for r in theirs if r["what"] == "vllm_prefill"}
    later = {r["tokens"]: r["ttft_s"] for r in (again or {}).get("prefill", [])}
    rows = {}
    for r in ours["prefill"]:
        if r["tokens"] not in vllm:
            continue
        row = {"deltaserve_s": r["ttft_s"], "vllm_s": round(vllm[r["tokens"]], 4),
               "ratio_to_vllm": round(r["ttft_s"] / vllm[r["tokens"]], 3)}
        if r["tokens"] in later:
            row["deltaserve_after_vllm_s"] = later[r["tokens"]]
            row["ratio_after_vllm"] = round(later[r["tokens"]] / vllm[r["tokens"]], 3)
        rows[f"prefill_{r['tokens']}"] = row
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=sorted(VLLM_SHAPES))
    ap.add_argument("--concurrency", default="1,32,64,128")
    ap.add_argument("--prefill", default="8192,32768")
    ap.add_argument("--prefill-again", action="store_true", help="deltaserve's prefills again after vLLM")
    ap.add_argument("--peer", default=".peer/bench.py", help="vLLM's bench.py")
    ap.add_argument("--gdn-state-dtype", default="float32", help="deltaserve's GDN recurrent state dtype")
    ap.add_argument("--vllm-state-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="vLLM's (auto: its own choice, the model dtype on these shapes' configs)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {**results_io.header(), "instrument": INSTRUMENT, "deltaserve_gdn_state_dtype": args.gdn_state_dtype,
              "vllm_state_dtype_asked": args.vllm_state_dtype}
    commit = results_io.commit()
    ours = run_tree(".", commit, args.shape, args.concurrency, args.prefill, args.gdn_state_dtype)
    print("deltaserve", ours["decode"], ours["prefill"], flush=True)
    results_io.write(args.out, {**result, "deltaserve_raw": ours})  # kept should vLLM fail
    theirs = run_vllm(args.peer, args.shape, args.concurrency, args.prefill, args.out + ".vllm.log",
                      args.vllm_state_dtype)
    print("vLLM", theirs, flush=True)
    again = (run_tree(".", commit, args.shape, "", args.prefill, args.gdn_state_dtype)
             if args.prefill_again and args.prefill else None)
    result.update({"decode": decode_rows(ours, theirs), **prefill_rows(ours, theirs, again),
                   "vllm_start_s": next((round(r["seconds"], 1) for r in theirs if r["what"] == "vllm_start"), None),
                   "vllm_state_dtype": next((r for r in theirs if r["what"] == "vllm_state_dtype"), None),
                   "deltaserve_raw": ours, "vllm_raw": theirs})
    if again is not None:
        result["deltaserve_after_vllm_raw"] = again
    results_io.write(args.out, result)
    for row in result["decode"]:
        print(f"C={row['concurrency']:>3} step {row['deltaserve_step_ms']} vs {row['vllm_step_ms']} ms, "
              f"closed batch x{row['closed_batch_speedup']}")
    for key, row in result.items():
        if key.startswith("prefill_"):
            print(key, row)


if __name__ == "__main__":
    main()
