"""Request fields -> SamplingParams, with the context-length check that needs the prompt."""

from __future__ import annotations

import logging
from typing import Any

from deltaserve.errors import InvalidSamplingParamsError
from deltaserve.sampling_params import MAX_LOGIT_BIAS, SamplingParams, StructuredOutputsParams, check_logprobs_count
from deltaserve.server.reasoning import THINK_CLOSE
from deltaserve.server.errors import bad_request, context_length_error
from deltaserve.server.off_loop import off_loop

MAX_N = 128  # OpenAI's bound on the choices of one request: each is a sequence the engine runs
# vLLM's fields that would change what is generated and that this server does not implement: refused by name
# where set, rather than ignored as fields it does not know are
NOT_IMPLEMENTED = {"logits_processors": "logits processors",
                   "guided_json": "guided_json (use structured_outputs or response_format)",
                   "guided_regex": "guided_regex (use structured_outputs)",
                   "guided_choice": "guided_choice (use structured_outputs)",
                   "guided_grammar": "guided_grammar (use structured_outputs)",
                   "prompt_embeds": "prompt_embeds (give the prompt as text or token ids)"}

logger = logging.getLogger(__name__)


def resolve_max_tokens(requested: int | None, prompt_len: int, max_model_len: int, param: str,
                       default: int | None = None, cap: int | None = None) -> int:
    """The number of tokens to generate; a request that cannot fit the context is refused.

    Without a limit the request may use what the context has left after the prompt, or the checkpoint's
    max_new_tokens (`default`) where that is less. `cap`: the most any request generates, whatever it asks
    (vLLM's override_max_tokens: the server's generation config, sampling_defaults.max_tokens_cap).
    """
    if requested is None:
        if prompt_len >= max_model_len:
            raise context_length_error(prompt_len, 1, max_model_len, param)
        requested = min(max_model_len - prompt_len, default or max_model_len)
    elif isinstance(requested, int) and requested >= 1 and prompt_len + requested > max_model_len:
        raise context_length_error(prompt_len, requested, max_model_len, param)
    return min(requested, cap) if cap is not None and isinstance(requested, int) and requested >= 1 else requested


def kept_prompt_tokens(truncate: int | None, max_model_len: int, max_output: int | None) -> int | None:
    """How many of the prompt's tokens vLLM's truncate_prompt_tokens keeps: k, or for -1 what the model's context
    leaves beside the `max_output` tokens the request asks (None: the whole prompt). A k past that is refused,
    as vLLM refuses it."""
    if truncate is None:
        return None
    room = max_model_len - (max_output or 0)
    if truncate == -1:
        return max(room, 1)  # a request asking the whole context for its output is refused by its length
    if truncate < 1:
        raise bad_request(f"truncate_prompt_tokens={truncate}: must be -1 (the model's context) or at least 1",
                          "truncate_prompt_tokens", "invalid_value")
    if truncate > room:
        raise bad_request(f"truncate_prompt_tokens={truncate} is more than the {room} tokens the model's context of "
                          f"{max_model_len} leaves beside the {max_output or 0} asked for the output",
                          "truncate_prompt_tokens", "invalid_value")
    return truncate


def truncated_tokens(token_ids: list[int], keep: int | None, side: str | None,
                     text_ids: list[int] | None = None) -> list[int]:
    """The prompt tokens truncate_prompt_tokens keeps: its last `keep` (vLLM's truncation_side "left", the
    default) or its first (side "right"); all of them where keep is None or covers them. `text_ids`: where the
    prompt is a text encoded with the tokenizer's special tokens around it, the text's own tokens: without a side
    those stay and the text loses its first tokens, as the tokenizer's own truncation keeps them (a BOS)."""
    if keep is None or len(token_ids) <= keep:
        return token_ids
    if side is None and text_ids is not None:
        head = _start_of(token_ids, text_ids)
        if head is not None:
            tail = token_ids[head + len(text_ids):]
            room = keep - head - len(tail)
            if room > 0:
                return token_ids[:head] + text_ids[-room:] + tail
    return token_ids[:keep] if side == "right" else token_ids[-keep:]


def _start_of(token_ids: list[int], inner: list[int]) -> int | None:
    """Where `inner` stands whole in `token_ids` between added tokens (a few at either end), or None."""
    extra = len(token_ids) - len(inner)
    for head in range(extra + 1):
        if token_ids[head:head + len(inner)] == inner:
            return head
    return None


def build_sampling_params(req: Any, *, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None,
                          defaults: dict[str, Any] | None = None) -> SamplingParams:
    """SamplingParams from the fields chat and completions share, where a field left unset takes the checkpoint's
    value (`defaults`, engine/sampling_defaults.py) or else the API's; range errors propagate."""
    defaults = defaults or {}

    def pick(name: str, default):
        value = getattr(req, name, None)
        return defaults.get(name, default) if value is None else value

    top_k = pick("top_k", -1)
    return SamplingParams(
        n=req.n,
        temperature=pick("temperature", 1.0),
        top_p=pick("top_p", 1.0),
        top_k=-1 if top_k == 0 else top_k,  # 0 means "off" to most OpenAI-style clients
        min_p=pick("min_p", 0.0),
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        stop=req.stop,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
        seed=req.seed,
        presence_penalty=pick("presence_penalty", 0.0),
        frequency_penalty=pick("frequency_penalty", 0.0),
        repetition_penalty=pick("repetition_penalty", 1.0),
        logit_bias=token_biases(getattr(req, "logit_bias", None)),
        allowed_token_ids=req.allowed_token_ids,
        bad_words=req.bad_words,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        thinking_token_budget=req.thinking_token_budget,
        repetition_detection=req.repetition_detection,
    )


def check_logprobs_field(name: str, value: int, engine: Any) -> None:
    """A request field counting logprobs a token, against the engine's max_logprobs: a 400 naming the field."""
    try:
        check_logprobs_count(name, value, engine.max_logprobs, engine.vocab_size)
    except InvalidSamplingParamsError as exc:
        raise bad_request(str(exc), name, "invalid_value") from None


def refuse_unsupported(req: Any, engine: Any) -> None:
    """Fields the server would otherwise accept and silently not honour, or whose combination means nothing:
    an error names them instead. Called once per request, before it is admitted."""
    if isinstance(req.n, int) and req.n > MAX_N:
        raise bad_request(f"n={req.n}: at most {MAX_N} choices a request", "n", "invalid_value")
    extra = req.model_extra or {}
    for name, what in NOT_IMPLEMENTED.items():
        if extra.get(name) not in (None, False, [], {}):
            raise bad_request(f"{name}: {what} is not supported", name, "unsupported_value")
    if extra:  # as vLLM does: fields it does not know are ignored, and said to be
        logger.warning("request fields ignored: %s", ", ".join(sorted(extra)))
    if req.priority != 0 and getattr(engine, "scheduling_policy", "fcfs") != "priority":  # as vLLM documents it
        raise bad_request(f"priority={req.priority}: priority scheduling is not enabled (only 0 is taken): start the "
                          "server with --scheduling-policy priority", "priority", "unsupported_value")
    if req.prompt_logprobs is not None and req.stream:  # as vLLM: they would come only with the last chunk
        raise bad_request("prompt_logprobs are not available with stream: true", "prompt_logprobs", "invalid_value")
    if req.prompt_logprobs is not None:  # before echo's logprobs join it
        check_logprobs_field("prompt_logprobs", req.prompt_logprobs, engine)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only for streamed responses (stream: true)", "stream_options",
                          "invalid_value")
    if getattr(req, "tools", None) == []:  # as OpenAI's and vLLM's: leave them out for none
        raise bad_request("tools must not be an empty array: leave it out for no tools", "tools", "invalid_value")
    tool_choice = getattr(req, "tool_choice", None)
    if tool_choice is not None and tool_choice != "none":
        if not getattr(req, "tools", None):
            raise bad_request("tool_choice needs tools", "tool_choice", "invalid_value")
        if tool_choice not in ("auto", "required") and tool_choice.function.name not in {
                t.function.name for t in req.tools}:
            raise bad_request(f"tool_choice names {tool_choice.function.name!r}, which is not among the tools",
                              "tool_choice", "invalid_value")
    if getattr(req, "suffix", None):
        raise bad_request("suffix is not supported: the model only continues the prompt", "suffix",
                          "unsupported_value")
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != req.n:
        raise bad_request(f"best_of={best_of} is not supported: ask for n choices instead", "best_of",
                          "unsupported_value")


def requested_structure(req: Any, opens_reasoning: bool = False) -> StructuredOutputsParams | None:
    """What the output must match: OpenAI's response_format (json_object, json_schema) or vLLM's
    structured_outputs, one of them. Where the prompt leaves a think block open the reasoning stays free and
    the constraint holds from its "</think>" on."""
    response_format = getattr(req, "response_format", None)
    kind = response_format.type if response_format is not None else "text"
    field = req.structured_outputs
    if field is not None and field.structural_tag is not None:
        raise bad_request("structured_outputs.structural_tag is not supported: give a json, json_object, regex, "
                          "choice or grammar", "structured_outputs.structural_tag", "unsupported_value")
    options = {}  # structured_outputs' options alone stand beside a response_format, as vLLM merges them
    if field is not None:
        options = dict(disable_any_whitespace=field.disable_any_whitespace,
                       whitespace_pattern=field.whitespace_pattern,
                       disable_additional_properties=field.disable_additional_properties,
                       disable_fallback=field.disable_fallback)
    if kind != "text" and field is not None and _names_a_constraint(field):
        raise bad_request("response_format and structured_outputs each constrain the output: give one",
                          "structured_outputs", "invalid_value")
    start_after = THINK_CLOSE if opens_reasoning else None
    try:
        if field is not None and kind == "text":
            return StructuredOutputsParams(json=field.json_, json_object=bool(field.json_object), regex=field.regex,
                                           choice=field.choice, grammar=field.grammar, start_after=start_after,
                                           **options)
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True, start_after=start_after, **options)
        if kind == "json_schema":
            spec = response_format.json_schema
            if spec is None or spec.schema_ is None:
                raise bad_request("response_format of type 'json_schema' needs json_schema.schema",
                                  "response_format", "invalid_value")
            return StructuredOutputsParams(json=spec.schema_, start_after=start_after, **options)
    except InvalidSamplingParamsError as exc:
        raise bad_request(str(exc), "structured_outputs", "invalid_value") from None
    raise bad_request(f"response_format of type {kind!r} is not supported (text, json_object or json_schema)",
                      "response_format", "unsupported_value")


def _names_a_constraint(field) -> bool:
    """Whether vLLM's structured_outputs names what the output must be (else it gives options alone)."""
    return any(value is not None for value in (field.json_, field.json_object, field.regex, field.choice,
                                               field.grammar))


async def check_structure(engine: Any, structure: StructuredOutputsParams | None, param: str) -> None:
    """Compiles the request's grammar off the event loop (the engine thread then finds it compiled); one that
    does not compile is a 400 naming `param`."""
    grammars = getattr(getattr(engine, "engine", None), "grammars", None)
    if structure is None or grammars is None:
        return
    try:
        await off_loop(engine, grammars.compile, structure)
    except InvalidSamplingParamsError as exc:  # named as the request named it (response_format, a tool choice)
        message = str(exc)
        if message.startswith("structured_outputs") and not param.startswith("structured_outputs"):
            message = param + message[len("structured_outputs"):]
        raise bad_request(message, param, "invalid_value") from None


def token_biases(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias (token ids as the JSON object's keys) with integer keys, each bias clamped to
    [-100, 100] as vLLM's server clamps it (OpenAI's range)."""
    if not logit_bias:
        return None
    for key in logit_bias:
        if not (key.isascii() and key.isdigit()):
            raise InvalidSamplingParamsError(f"logit_bias={key!r}: keys must be token ids (integers)")
        if len(key.lstrip("0")) > 20:  # past any int64 (and past int()'s 4300-digit limit, a ValueError)
            raise InvalidSamplingParamsError(f"logit_bias={key[:24]}...: token id outside the vocabulary")
    return {int(key): _clamped(bias) for key, bias in logit_bias.items()}


def _clamped(bias):
    if isinstance(bias, bool) or not isinstance(bias, (int, float)) or bias != bias:
        return bias  # not a number: SamplingParams names it
    return min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, bias))
