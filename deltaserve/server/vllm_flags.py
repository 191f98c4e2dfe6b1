"""vLLM's `serve` flags that a command line written for vLLM carries, so that it starts deltaserve as it is:
each is taken where deltaserve does what it asks (or always does it), and refused by name where it cannot."""

from __future__ import annotations

import argparse
from typing import Any

from deltaserve.errors import DeltaServeError
from deltaserve.vllm_engine_args import ONLY, refusal

# vLLM's names for the tool-call formats that tool_parsers/ reads: within <tool_call> tags, Qwen3's JSON bodies
# (hermes) and the XML bodies of Qwen3.5 and Qwen3-Next (qwen3_coder, qwen3_xml), whichever it meets; or the bare
# JSON calls of Llama 3.x and 4 (llama3_json, llama4_json); or a Python list of calls (pythonic, llama4_pythonic).
TOOL_CALL_PARSERS = ("hermes", "qwen3_coder", "qwen3_xml", "llama3_json", "llama4_json", "pythonic",
                     "llama4_pythonic")
# vLLM's names for `<think>...</think>` split from the answer, the one reasoning format reasoning.py reads.
REASONING_PARSERS = ("qwen3", "deepseek_r1")


# vLLM's tuning flags for what deltaserve does its own way: taken and dropped, with the reason in --help.
# (names, takes a value, why)
_GRAPHS = "deltaserve captures its own CUDA graphs of its own kernels (--enforce-eager turns them off)"
_KERNELS = "deltaserve runs its own Triton kernels and model code"
_TEXT = "deltaserve loads no vision encoder and takes text only"
_SCHEDULER = "deltaserve prefills a long prompt in chunks of --max-num-batched-tokens beside the running decodes"
DROPPED = [
    (("-O", "--optimization-level"), True, _GRAPHS),
    (("--compilation-config", "-cc"), True, _GRAPHS),
    (("--max-cudagraph-capture-size",), True, _GRAPHS),
    (("--cudagraph-capture-sizes",), "+", _GRAPHS),
    (("--performance-mode",), True, _GRAPHS),
    (("--attention-backend",), True, _KERNELS),
    (("--moe-backend",), True, _KERNELS),
    (("--linear-backend",), True, _KERNELS),
    (("--gdn-prefill-backend",), True, _KERNELS),
    (("--mamba-backend",), True, _KERNELS),
    (("--disable-cascade-attn",), False, _KERNELS),
    (("--mamba-cache-mode",), True, "deltaserve's prefix cache keeps GDN state snapshots its own way"),
    (("--mamba-block-size",), True, "deltaserve's prefix cache keeps GDN state snapshots its own way"),
    (("--disable-hybrid-kv-cache-manager",), False, "deltaserve keeps GDN states in slots beside the paged KV"),
    (("--long-prefill-token-threshold",), True, _SCHEDULER),
    (("--max-num-partial-prefills",), True, _SCHEDULER),
    (("--max-long-partial-prefills",), True, _SCHEDULER),
    (("--stream-interval",), True, "a stream sends each step's tokens as they come"),
    (("--swap-space",), True, "deltaserve swaps nothing to the CPU"),
    (("--mm-processor-kwargs",), True, _TEXT),
    (("--media-io-kwargs",), True, _TEXT),
    (("--allowed-local-media-path",), True, _TEXT),
    (("--allowed-media-domains",), "+", _TEXT),
    (("--mm-encoder-attn-backend",), True, _TEXT),
    (("--mm-shm-cache-max-object-size-mb",), True, _TEXT),
    (("--video-pruning-rate",), True, _TEXT),
    (("--skip-mm-profiling",), False, _TEXT),
    (("--enable-mm-embeds",), False, _TEXT),
    (("--disable-chunked-mm-input",), False, _TEXT),
    (("--interleave-mm-strings",), False, _TEXT),
]
# vLLM's flags of what deltaserve cannot do: refused by name wherever given. (names, takes a value, why)
REFUSED = [
    (("--headless",), False, "deltaserve runs its engine in the server's own process"),
    (("--tool-parser-plugin",), True, "deltaserve imports no code a flag names"),
    (("--reasoning-parser-plugin",), True, "deltaserve imports no code a flag names"),
    (("--middleware",), "+", "deltaserve imports no code a flag names"),
    (("--lora-modules",), "+", "deltaserve serves no LoRA adapters"),
    (("--max-lora-rank",), True, "deltaserve serves no LoRA adapters"),
]


def _dest(names: tuple[str, ...]) -> str:
    """Where a table's flag is stored: under its longest name, apart from deltaserve's own settings."""
    return "vllm_" + max(names, key=len).lstrip("-").replace("-", "_")


def _add_table(g, table, prefix: str) -> None:
    for names, value, why in table:
        kind = {"action": "store_true"} if value is False else {"nargs": "+"} if value == "+" else {}
        g.add_argument(*names, dest=_dest(names), default=None, help=f"{prefix}: {why}", **kind)


def add_vllm_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM's flags", "taken so that a command line written for vLLM starts deltaserve")
    g.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction, default=False,
                   help="accepted: deltaserve runs no code from a checkpoint, so there is none to trust")
    g.add_argument("--enable-auto-tool-choice", action=argparse.BooleanOptionalAction, default=False,
                   help="accepted: tool calls are parsed wherever the chat template speaks of tools")
    g.add_argument("--tool-call-parser", default=None,
                   help=f"{', '.join(TOOL_CALL_PARSERS)}: the format of the model's tool calls: <tool_call> tags "
                        "(the first three, each body form whichever is named), Llama's bare JSON (the next two) or a "
                        "Python list of calls (the last two); default: the one the chat template asks for (any "
                        "other is refused)")
    g.add_argument("--reasoning-parser", default=None,
                   help=f"{' or '.join(REASONING_PARSERS)}: split <think> blocks from the answer into "
                        "reasoning (default: where the chat template thinks)")
    g.add_argument("--enable-reasoning", action="store_true",
                   help="accepted (older vLLM's companion of --reasoning-parser): replies are split where the "
                        "template thinks or a reasoning parser is named")
    g.add_argument("--language-model-only", action=argparse.BooleanOptionalAction, default=False,
                   help="accepted: deltaserve loads a Qwen3.5 checkpoint's language model only")
    for flag in ("--limit-mm-per-prompt", "--mm-encoder-tp-mode", "--mm-processor-cache-type",
                 "--mm-processor-cache-gb"):  # a vision encoder's settings
        g.add_argument(flag, default=None, help="accepted: deltaserve loads no vision encoder and takes text only")
    g.add_argument("--disable-log-stats", action=argparse.BooleanOptionalAction, default=False,
                   help="no periodic stats line in the log (by default one every VLLM_LOG_STATS_INTERVAL "
                        "seconds, 10, while the engine works)")
    g.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=False,
                   help="log each accepted request's id and sampling parameters (INFO) and its prompt (DEBUG)")
    g.add_argument("--disable-log-requests", action="store_true",
                   help="accepted (older vLLM's): requests are logged only with --enable-log-requests")
    # checked against vllm_engine_args.ONLY, as LLM's arguments of the same names
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                   help="1 only: deltaserve runs a model on one GPU")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=None, help="1 only, as -tp")
    g.add_argument("--data-parallel-size", "-dp", type=int, default=None, help="1 only, as -tp")
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="accepted: a prompt longer than --max-num-batched-tokens is always prefilled in chunks "
                        "(--no-enable-chunked-prefill is refused)")
    g.add_argument("--tokenizer-mode", default=None, help="auto or hf: the checkpoint's own fast tokenizer")
    g.add_argument("--kv-cache-dtype", default=None, help="auto only: the KV cache is kept in the model's dtype")
    g.add_argument("--quantization", "-q", default=None,
                   help="fp8 for an FP8 checkpoint (which loads without it too); any other is refused: deltaserve "
                        "quantizes no weights itself")
    g.add_argument("--mamba-cache-dtype", choices=("auto", "float32", "bfloat16"), default=None,
                   help="the GDN state's dtype where --mamba-ssm-cache-dtype does not name it (the conv state stays "
                        "in the model's dtype)")
    g.add_argument("--enable-lora", action=argparse.BooleanOptionalAction, default=None,
                   help="refused: deltaserve serves no LoRA adapters")
    g.add_argument("--tokenizer", default=None, help="the model itself only: deltaserve reads the tokenizer from "
                   "its checkpoint")
    g.add_argument("--hf-overrides", default=None, help="refused: deltaserve reads the checkpoint's config as it is")
    g.add_argument("--enable-sleep-mode", action=argparse.BooleanOptionalAction, default=None,
                   help="refused: deltaserve keeps its weights on the GPU while it runs")
    g.add_argument("--cpu-offload-gb", type=float, default=None, help="0 only: every weight stays on the GPU")
    g.add_argument("--response-role", default="assistant",
                   help="the role of a chat reply that opens a new turn (add_generation_prompt)")
    g.add_argument("--enable-force-include-usage", action=argparse.BooleanOptionalAction, default=False,
                   help="every streamed reply ends with its usage, as if its stream_options asked")
    g.add_argument("--enable-prompt-tokens-details", action=argparse.BooleanOptionalAction, default=False,
                   help="accepted: usage always carries prompt_tokens_details (its cached tokens)")
    g.add_argument("--return-tokens-as-token-ids", action=argparse.BooleanOptionalAction, default=False,
                   help="logprobs name each token \"token_id:ID\" unless a request says otherwise")
    g.add_argument("--enable-tokenizer-info-endpoint", action=argparse.BooleanOptionalAction, default=False,
                   help="serve GET /tokenizer_info: the tokenizer's settings (tokenizer_config.json's), its class "
                        "and the chat template (off by default, as vLLM's: it shows them to every client with a "
                        "key)")
    g.add_argument("--shutdown-timeout", type=_whole_seconds, default=0,
                   help="on SIGTERM or Ctrl+C, seconds to let the requests in flight finish, new ones refused (503), "
                        "before the rest are ended (default: 0, at once)")
    g.add_argument("--enable-server-load-tracking", action=argparse.BooleanOptionalAction, default=False,
                   help="accepted: /load always answers with the requests the engine holds")
    g.add_argument("--max-log-len", type=int, default=None,
                   help="with --enable-log-requests, the most characters (or token ids) of a prompt logged")
    g.add_argument("--enable-expert-parallel", "-ep", action=argparse.BooleanOptionalAction, default=False,
                   help="accepted: deltaserve's one GPU holds every expert")
    g.add_argument("--disable-custom-all-reduce", action=argparse.BooleanOptionalAction, default=False,
                   help="accepted: on one GPU there is no all-reduce")
    g.add_argument("--distributed-executor-backend", default=None,
                   help="accepted: deltaserve runs the model in its own process on one GPU")
    _add_table(g, DROPPED, "accepted")
    _add_table(g, REFUSED, "refused")


def _whole_seconds(text: str) -> int:
    """--shutdown-timeout: a whole number of seconds, 0 or more, as vLLM's."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0 (0: requests in flight end at once)")
    return value


def check_vllm_flags(args: Any) -> bool | None:
    """Refuses what deltaserve cannot do; returns whether replies are split into reasoning and answer where a
    reasoning parser is named (None: as the chat template says)."""
    for name in ("tool_call_parser", "reasoning_parser"):  # vLLM reads "" (an unset variable) and "None" as unset
        if getattr(args, name, None) in ("", "None"):
            setattr(args, name, None)
    parser = getattr(args, "tool_call_parser", None)
    if parser is not None and parser not in TOOL_CALL_PARSERS:
        raise DeltaServeError(f"--tool-call-parser {parser}: deltaserve reads the tool calls of "
                              f"{', '.join(TOOL_CALL_PARSERS)} (Qwen3's JSON and Qwen3.5's XML bodies in "
                              "<tool_call> tags, Llama's bare JSON, a Python list of calls), not others")
    reasoning = getattr(args, "reasoning_parser", None)
    if reasoning is not None and reasoning not in REASONING_PARSERS:
        raise DeltaServeError(f"--reasoning-parser {reasoning}: deltaserve splits <think> blocks "
                              f"({', '.join(REASONING_PARSERS)}), not others")
    for names, _, why in REFUSED:
        if getattr(args, _dest(names), None) is not None:
            raise DeltaServeError(f"{max(names, key=len)}: {why}")
    for name in (*ONLY, "tokenizer"):
        value = getattr(args, name, None)
        reason = refusal(name, value, getattr(args, "model", None)) if value is not None else None
        if reason is not None:
            flag = "--" + name.replace("_", "-")
            shown = flag if value is True else "--no-" + flag[2:] if value is False else f"{flag} {value}"
            raise DeltaServeError(f"{shown}: {reason}")
    return True if reasoning is not None else None
