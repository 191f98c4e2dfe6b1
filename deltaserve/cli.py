"""deltaserve generate | serve | chat | bench serve."""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal, InvalidOperation

from deltaserve.chat_content_format import CONTENT_FORMATS
from deltaserve.engine.load_formats import LOAD_FORMATS
from deltaserve.engine.waiting_queue import SCHEDULING_POLICIES
from deltaserve.errors import DeltaServeError
from deltaserve.sampling_params import LOGPROBS_MODES


def _engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="checkpoint: an HF directory, a .gguf file or a Hugging Face repo id (org/name: its snapshot in "
                        "the local hub cache, downloaded there first if missing) (default: the built-in demo model)")
    p.add_argument("--model", dest="model_option", default=None, help="the checkpoint, as the positional MODEL")
    p.add_argument("--config", default=None,
                   help="a YAML file of these flags (`port: 8000`, `max-model-len: 32768`, ...); the command "
                        "line's own flags override it")
    p.add_argument("--revision", default=None, help="the hub revision (branch, tag or commit) of a repo id")
    p.add_argument("--download-dir", default=None,
                   help="the hub cache a repo id's checkpoint is read from and downloaded to (default: Hugging "
                        "Face's)")
    p.add_argument("--hf-token", nargs="?", const=True, default=None,
                   help="the Hugging Face token a repo id's download takes (alone: the one `hf auth login` "
                        "stored; default: HF_TOKEN, else that one)")
    p.add_argument("--dtype", default=None, help="auto (default), float32, bfloat16, float16")
    p.add_argument("--device", default=None, help="auto (default: CUDA when present), cuda, cpu")
    p.add_argument("--max-model-len", type=context_length, default=None,
                   help="context length, as 32768, 32k or 32K (default, or auto: the model's)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="most sequences running at once")
    p.add_argument("--max-num-batched-tokens", type=token_count, default=None,
                   help="token budget of one step, as 8192, 8k or 8K")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block")
    p.add_argument("--num-kv-blocks", "--num-gpu-blocks-override", type=int, default=None,
                   help="KV blocks in the pool (default: sized to memory)")
    p.add_argument("--seed", type=int, default=None, help="engine seed")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse KV blocks and recurrent-state snapshots across requests (default: on)")
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="turn prefix caching off")
    p.add_argument("--ssm-snapshot-slots", type=int, default=None,
                   help="GDN state snapshots the prefix cache keeps (default: sized to memory)")
    p.add_argument("--ssm-snapshot-interval", type=int, default=None,
                   help="save a GDN state snapshot every N prompt tokens (default: 1024)")
    p.add_argument("--decode-snapshot-interval", type=int, default=None,
                   help="save a GDN state snapshot every N tokens while decoding (default: 256)")
    p.add_argument("--gdn-state-dtype", "--mamba-ssm-cache-dtype", choices=("auto", "float32", "bfloat16"),
                   default=None, help="dtype of the GDN layers' recurrent state and its snapshots (default: auto, the "
                   "config's mamba_ssm_dtype where it names one, else float32)")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="never capture CUDA graphs")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="share of the GPU's free memory at start-up that the engine may take (default: 0.9)")
    p.add_argument("--kv-cache-memory-bytes", type=byte_count, default=None,
                   help="the cache's size in bytes, as 8G (GiB), 8g (10^9) or a plain number, in place of "
                        "--gpu-memory-utilization's share: the KV pool, and on a GDN model its state and snapshot "
                        "slots, are sized to it (default: sized to memory)")
    p.add_argument("--chat-template", default=None,
                   help="a chat template (a file, or the template itself) in place of the checkpoint's")
    p.add_argument("--chat-template-content-format", choices=CONTENT_FORMATS, default=None,
                   help="how the template is given a message's content: string (the text of its parts, joined by "
                        "newlines), openai (a list of {type: text, text} parts) or auto (default: openai where the "
                        "template loops over a message's content)")
    p.add_argument("--generation-config", default=None,
                   help="sampling defaults for fields a request leaves unset: auto (default: the checkpoint's "
                        "generation_config.json), vllm (the API's own), or a directory holding a "
                        "generation_config.json")
    p.add_argument("--override-generation-config", type=_json_object, default=None,
                   help="a JSON object of generation_config.json values (temperature, top_p, top_k, min_p, "
                        "repetition_penalty, max_new_tokens) set over those --generation-config gives")
    p.add_argument("--max-logprobs", type=int, default=None,
                   help="the most logprobs a request may ask a token (logprobs, top_logprobs, prompt_logprobs; "
                        "default: 20); -1: the whole vocabulary")
    p.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default=None,
                   help="what a generated token's logprobs report: raw_logprobs (default: the model's, before "
                        "biases, penalties and temperature), raw_logits, or processed_logprobs / processed_logits "
                        "(those it is drawn from, after them and top-k, top-p and min-p); prompt logprobs are "
                        "always raw_logprobs")
    p.add_argument("--load-format", choices=LOAD_FORMATS, default=None,
                   help="dummy: random weights in the checkpoint's shapes, from its config.json alone (benchmarks); "
                        "safetensors or gguf: the checkpoint must be of that format (auto: either)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="plan the next decode step while the GPU runs this one (default: on); "
                        "--no-async-scheduling reads each step's tokens back first")
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default=None,
                   help="the order requests are served in: fcfs (default: by arrival; a request's priority must be "
                        "0) or priority (by a request's priority field, the lowest value first, then by arrival: "
                        "admitted first, and preempted last when KV blocks run out)")
    p.add_argument("--profiler-config", type=_json_object, default=None,
                   help="vLLM's profiler settings as a JSON object (or key by key, --profiler-config.profiler "
                        "torch): profiler torch (its trace of the steps between /start_profile and /stop_profile "
                        "written to torch_profiler_dir) or cuda (the CUDA profiler's capture range, for nsys), "
                        "delay_iterations, max_iterations and the torch_profiler_* options")
    p.add_argument("--speculative-config", "-sc", type=_json_object, default=None,
                   help="vLLM's speculative decoding settings as a JSON object: {\"method\": \"mtp\", "
                        "\"num_speculative_tokens\": k} drafts k tokens a step with the model's own "
                        "multi-token-prediction head (Qwen3.5, Qwen3-Next) and verifies them in the next; "
                        "{\"method\": \"ngram\", \"num_speculative_tokens\": k, \"prompt_lookup_max\": n} drafts by "
                        "prompt lookup, on any model")
    p.add_argument("--spec-method", default=None, help="speculative_config's method, key by key (vLLM's)")
    p.add_argument("--spec-tokens", type=int, default=None,
                   help="speculative_config's num_speculative_tokens, key by key (vLLM's)")
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false", default=None,
                   help="skip the start-up prefill steps that compile the prefill kernels (default: on a GPU)")


# vLLM's suffixes for its human-readable integers (token counts, bytes): lower case decimal (32k = 32000), upper
# case binary (32K = 32768)
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _human_int(text: str) -> int:
    """A whole number, plain or with vLLM's suffixes (25.6k is 25600; a binary suffix takes whole numbers only);
    ValueError where it is none."""
    number, suffix = (text[:-1], text[-1]) if text[-1:] in {**_DECIMAL, **_BINARY} else (text, "")
    try:
        if suffix in _BINARY:
            return int(number) * _BINARY[suffix]
        if suffix in _DECIMAL:
            value = Decimal(number) * _DECIMAL[suffix]  # exact: 4.35k is 4350, where a float gives 4349.99...
            if value != value.to_integral_value() or not number[:1].isdigit():
                raise ValueError
            return int(value)
        return int(number)
    except InvalidOperation:
        raise ValueError(text) from None


def token_count(text: str) -> int:
    """A whole number of tokens, plain or with vLLM's suffixes."""
    text = text.strip()
    try:
        return _human_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens (as 32768, 32k or 32K)") from None


def byte_count(text: str) -> int:
    """--kv-cache-memory-bytes: a positive number of bytes, plain or with vLLM's suffixes (8G is 8 GiB)."""
    text = text.strip()
    try:
        value = _human_int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of bytes (as 8589934592, 8G for 8 GiB "
                                         "or 8g for 8*10^9)")
    return value


def context_length(text: str) -> int | None:
    """--max-model-len: tokens as token_count reads them, or vLLM's "auto" (and -1): the model's, as unset."""
    return None if text.strip().lower() in ("auto", "-1") else token_count(text)


def queue_length(text: str) -> int:
    """--max-queue: a whole number of waiting requests, at least 1 (0 or less would refuse every request)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1: the server would refuse every request "
                                         "(leave the flag out for no limit)")
    return value


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deltaserve", description="LLM inference engine and OpenAI-compatible server")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate a completion for one prompt and print it")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--model", default=None, help="checkpoint (default: the built-in demo model)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--seed", type=int, default=None, help="sampling seed")
    gen.add_argument("--chat", action="store_true", help="send the prompt as a user message through the chat template")
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--device", default="auto")
    gen.add_argument("--max-model-len", type=context_length, default=None)

    srv = sub.add_parser("serve", help="serve the OpenAI and Anthropic HTTP APIs")
    _engine_options(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    srv.add_argument("--port", type=int, default=8000, help="port (0 picks a free one)")
    srv.add_argument("--api-key", nargs="+", default=None,
                     help="require this key, or one of these keys (env: DELTASERVE_API_KEY or vLLM's VLLM_API_KEY, "
                          "one key)")
    srv.add_argument("--served-model-name", nargs="+", default=None, help="name(s) clients use for the model")
    srv.add_argument("--max-queue", type=queue_length, default=None,
                     help="most requests waiting for the engine; beyond it requests get 503 + Retry-After")
    srv.add_argument("--default-chat-template-kwargs", type=_json_object, default=None,
                     help="chat template variables for every chat, under a request's own chat_template_kwargs "
                          "(as '{\"enable_thinking\": false}')")
    srv.add_argument("--trust-request-chat-template", action=argparse.BooleanOptionalAction, default=False,
                     help="let a chat request bring its own chat_template (it runs on the server)")
    srv.add_argument("--exclude-tools-when-tool-choice-none", action=argparse.BooleanOptionalAction, default=False,
                     help="render a chat whose tool_choice is \"none\" without its tools (by default, as vLLM's, "
                          "the template shows them and the reply is read for no calls)")
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    from deltaserve.server.http_options import add_http_arguments
    from deltaserve.server.vllm_flags import add_vllm_flags

    add_http_arguments(srv)
    add_vllm_flags(srv)

    chat = sub.add_parser("chat", help="chat with a model in the terminal")
    _engine_options(chat)
    chat.add_argument("--system", default=None, help="a system prompt")
    chat.add_argument("--max-tokens", type=int, default=None,
                      help="longest reply (default: the generation config's max_new_tokens, else what the context "
                           "leaves)")
    chat.add_argument("--temperature", type=float, default=None,
                      help="default: the generation config's (the checkpoint's own, as --generation-config says), "
                           "else 1.0")
    chat.add_argument("--top-p", type=float, default=None, help="default: the generation config's, else 1.0")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from deltaserve.bench.serve import add_arguments

    add_arguments(bench_sub.add_parser("serve", help="drive an OpenAI-compatible server at several concurrencies"))
    return parser


def _generate(args: argparse.Namespace) -> int:
    from deltaserve import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    if args.chat:
        outputs = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)
    else:
        outputs = llm.generate([args.prompt], params, use_tqdm=False)
    print(outputs[0].outputs[0].text)
    return 0


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command line, with a --config file's flags under it (config_file.py) and --model read as MODEL."""
    from deltaserve.config_file import parse_with_config_file

    from deltaserve.vllm_argv import vllm_spelling

    parser = _build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    args = parse_with_config_file(parser, {name: commands[name] for name in ("serve", "chat")}, vllm_spelling(argv))
    option = getattr(args, "model_option", None)
    if option is not None:
        if args.model is not None and args.model != option:
            raise DeltaServeError(f"the model is given twice, as {args.model} and --model {option}: give one")
        args.model = option
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parse(sys.argv[1:] if argv is None else argv)
    except DeltaServeError as exc:
        print(f"deltaserve: error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "serve":
            from deltaserve.server.launcher import serve

            return serve(args)
        if args.command == "chat":
            from deltaserve.chat_repl import run

            return run(args)
        if args.command == "bench" and args.bench_command == "serve":
            from deltaserve.bench.serve import run

            return run(args)
    except DeltaServeError as exc:
        print(f"deltaserve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
