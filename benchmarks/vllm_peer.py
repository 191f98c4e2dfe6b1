"""vLLM's peer bench.py (staged by ../shared/peers/vllm under .peer/) with its GDN recurrent state held in
a dtype named here, as a real checkpoint names it.

    python3 benchmarks/vllm_peer.py --state-dtype float32 .peer/bench.py qwen3.5-9b-shape 32,64,128

The shapes' configs are transformers' defaults, which name no `mamba_ssm_dtype`, so vLLM keeps that state
in the model's dtype (bf16). The released Qwen3.5 checkpoints' configs name `"mamba_ssm_dtype":
"float32"`, and with them vLLM keeps it in fp32, as deltaserve does by default. Passing vLLM's own
`mamba_ssm_cache_dtype` engine argument here gives the peer the state a real checkpoint would; everything
else is bench.py's own (its arguments follow the script's path).
"""

import argparse
import json
import runpy
import sys


def with_state_dtype(llm_class: type, state_dtype: str) -> type:
    """A subclass of vLLM's LLM that passes `mamba_ssm_cache_dtype` to every engine it starts."""
    class LLMWithStateDtype(llm_class):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("mamba_ssm_cache_dtype", state_dtype)
            super().__init__(*args, **kwargs)
            # What the engine settled on, after the model's own config hook: the figures' precision.
            cache = self.llm_engine.vllm_config.cache_config
            print(json.dumps({"what": "vllm_state_dtype", "mamba_ssm_cache_dtype": str(cache.mamba_ssm_cache_dtype),
                              "mamba_cache_dtype": str(cache.mamba_cache_dtype)}), flush=True)
    return LLMWithStateDtype


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state-dtype", required=True, choices=("float32", "bfloat16"))
    ap.add_argument("peer", help="vLLM's bench.py")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="bench.py's own arguments")
    args = ap.parse_args()
    import vllm  # bench.py imports LLM from here when it runs, so the subclass is what it gets
    vllm.LLM = with_state_dtype(vllm.LLM, args.state_dtype)
    sys.argv = [args.peer, *args.args]
    runpy.run_path(args.peer, run_name="__main__")


if __name__ == "__main__":
    main()
