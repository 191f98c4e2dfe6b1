"""engine_bench.py of two or more source trees on one GPU, alternated in one command.

    python benchmarks/engine_ab.py qwen3.5-35b-a3b --trees .base=f753d9b,.=938b7ae --prefill 8192,32768 \
        --rounds 2 --out benchmarks/results/engine_prefill_X_same_machine.json

Each run is that tree's own benchmarks/engine_bench.py in a fresh process, with DELTASERVE_COMMIT set
to the tree's label. Odd rounds run the trees in the order given and even rounds in reverse (A B B A),
so that the card's drift over the command (its clocks, its temperature) falls on every tree alike.
`--concurrency` (empty by default: prefill only), `--prefill`, `--prefill-passes`, `--gdn-state-dtype`,
`--max-model-len`, `--max-num-batched-tokens`, `--prompt-len`, `--temperature`, `--top-p`, `--top-k` and the
three penalties pass through.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import results_io  # this directory's module: first on the path of a script


def run_tree(tree: str, label: str, shape: str, concurrency: str, prefill: str, gdn_state_dtype: str = "float32",
             max_model_len: int = 33024, prompt_len: int | None = None, options: tuple = (),
             prefill_passes: int = 1) -> dict:
    """One run of the tree's own engine_bench.py in a fresh process: its result."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "run.json")
        command = [sys.executable, "benchmarks/engine_bench.py", shape, "--concurrency", concurrency,
                   "--prefill", prefill, "--gdn-state-dtype", gdn_state_dtype,
                   "--max-model-len", str(max_model_len), "--out", out]
        if prompt_len is not None:  # a tree whose engine_bench predates the option runs without it
            command += ["--prompt-len", str(prompt_len)]
        command += list(options)  # only those set: a tree whose engine_bench predates the others runs too
        if prefill_passes > 1:  # likewise
            command += ["--prefill-passes", str(prefill_passes)]
        subprocess.run(command, cwd=tree, env=dict(os.environ, DELTASERVE_COMMIT=label), check=True,
                       stdout=subprocess.DEVNULL)
        return json.load(open(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--trees", required=True, help="comma-separated dir=label, the base first")
    ap.add_argument("--concurrency", default="")
    ap.add_argument("--prefill", default="8192,32768")
    ap.add_argument("--gdn-state-dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=33024)
    ap.add_argument("--prompt-len", type=int, default=None, help="the decode batches' (engine_bench's default: 128)")
    ap.add_argument("--temperature", type=float, default=0.0, help="the decode batches' (0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--repetition-penalty", type=float, default=1.0)
    ap.add_argument("--frequency-penalty", type=float, default=0.0)
    ap.add_argument("--presence-penalty", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prefill-passes", type=int, default=1, help="engine_bench's: prefill passes timed a length")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="engine_bench's step budget (its default: a whole prompt in one pass)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    trees = [t.split("=") for t in args.trees.split(",")]
    options = ("--temperature", str(args.temperature), "--top-p", str(args.top_p)) if args.temperature else ()
    options += ("--top-k", str(args.top_k)) if args.top_k > 0 else ()
    if args.max_num_batched_tokens is not None:
        options += ("--max-num-batched-tokens", str(args.max_num_batched_tokens))
    for name, off in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
        if getattr(args, name) != off:
            options += ("--" + name.replace("_", "-"), str(getattr(args, name)))
    result = {**results_io.header(), "shape": args.shape, "trees": dict(trees), "temperature": args.temperature,
              "top_p": args.top_p, "top_k": args.top_k, "repetition_penalty": args.repetition_penalty,
              "frequency_penalty": args.frequency_penalty, "presence_penalty": args.presence_penalty,
              "max_num_batched_tokens": args.max_num_batched_tokens, "runs": []}
    for round_ in range(1, args.rounds + 1):
        for tree, label in trees if round_ % 2 else trees[::-1]:
            run = run_tree(tree, label, args.shape, args.concurrency, args.prefill, args.gdn_state_dtype,
                           args.max_model_len, args.prompt_len, options, args.prefill_passes)
            entry = {"round": round_, "commit": label, "startup_s": run["startup_s"],
                     "decode": run["decode"], "prefill": run["prefill"]}
            result["runs"].append(entry)
            print(label, round_, [(r["tokens"], r["ttft_s"]) for r in run["prefill"]],
                  [(r["concurrency"], r["step_ms"], r["closed_batch_tok_s"]) for r in run["decode"]], flush=True)
            results_io.write(args.out, result)


if __name__ == "__main__":
    main()
