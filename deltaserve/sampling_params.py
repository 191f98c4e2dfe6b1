"""SamplingParams: what a request asks of the sampler, with vLLM's meanings."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import IntEnum

from deltaserve.errors import InvalidSamplingParamsError
from deltaserve.tokenizer import LONE_SURROGATE

MAX_LOGPROBS = 20  # the default cap on logprobs a token (vLLM's and the OpenAI API's); the engine's max_logprobs sets it
# What a generated token's logprobs report (vLLM's logprobs_mode). raw: the model's distribution (under a grammar's
# mask), before biases, penalties and temperature; processed: the one the token is drawn from, after them and top-k,
# top-p and min-p (a greedy row's before temperature, as vLLM's)
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's bound on logprob_token_ids
# OpenAI's range, the server's and from_optional's clamp: -100 bans a token, 100 makes it the only choice
MAX_LOGIT_BIAS = 100.0
# vLLM's: a temperature above 0 and below this is raised to it (logits over 1e-45 would overflow to inf and the
# row's softmax to NaN); only 0 samples greedily. And OpenAI's and vLLM's upper bound.
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 2.0
# The sampler computes in float32: a value past these rounds to inf or 0 there.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32


@dataclass
class StructuredOutputsParams:
    """What a request's output must match, as vLLM's StructuredOutputsParams: exactly one of a JSON schema
    (`json`, a dict or its JSON text), any JSON object (`json_object`), a regular expression (`regex`), one
    of a list of strings (`choice`) or a context-free grammar (`grammar`: Lark, as llguidance reads it, or
    GBNF / the EBNF of vLLM's examples, `root ::= ...`). `start_after`: the constraint holds only after the
    output has produced this text (a reasoning model's "</think>"); before it the output is free.

    For JSON (a schema or any object), as vLLM reads them: `disable_any_whitespace` allows no whitespace between
    JSON tokens, `whitespace_pattern` is the regular expression that whitespace must match instead, and
    `disable_additional_properties` asks a schema's objects closed where it does not say, as vLLM's guidance
    backend reads it: they always are here, as vLLM's default backend reads a schema (closed_schema.py).
    `disable_fallback` asks that no other backend take over, which none does here."""

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    start_after: str | None = None
    disable_any_whitespace: bool = False
    whitespace_pattern: str | None = None
    disable_additional_properties: bool = False
    disable_fallback: bool = False
    structural_tag: str | None = None  # vLLM's: taken at None, refused otherwise (no structural tags here)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.structural_tag is not None:
            raise InvalidSamplingParamsError("structured_outputs.structural_tag is not supported: give a json, "
                                             "json_object, regex, choice or grammar")
        kinds = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        if not isinstance(self.json_object, bool):
            raise InvalidSamplingParamsError(f"structured_outputs.json_object={self.json_object!r}: must be True "
                                             "or False")
        kinds += ["json_object"] * self.json_object
        if len(kinds) != 1:
            raise InvalidSamplingParamsError("structured_outputs needs exactly one of json, json_object, regex, "
                                             f"choice and grammar, got {', '.join(kinds) or 'none'}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise InvalidSamplingParamsError(f"structured_outputs.json: a JSON schema must be an object or its "
                                             f"text, got {type(self.json).__name__}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise InvalidSamplingParamsError("structured_outputs.regex must be a string")
        if self.choice is not None and (not isinstance(self.choice, (list, tuple)) or not self.choice
                                        or not all(isinstance(c, str) for c in self.choice)):
            # as vLLM's, a choice may be "" (the empty answer)
            raise InvalidSamplingParamsError("structured_outputs.choice must be a non-empty list of strings")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise InvalidSamplingParamsError("structured_outputs.grammar must be a non-empty string")
        if self.start_after is not None and (not isinstance(self.start_after, str) or not self.start_after):
            raise InvalidSamplingParamsError("structured_outputs.start_after must be a non-empty string")
        for name in ("disable_any_whitespace", "disable_additional_properties", "disable_fallback"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidSamplingParamsError(f"structured_outputs.{name}={getattr(self, name)!r}: must be True "
                                                 "or False")
        if self.whitespace_pattern is not None and (not isinstance(self.whitespace_pattern, str)
                                                    or not self.whitespace_pattern):
            raise InvalidSamplingParamsError("structured_outputs.whitespace_pattern must be a non-empty string")


@dataclass
class RepetitionDetectionParams:
    """vLLM's repetition_detection: the output ends (finish_reason "repetition") once its last tokens are
    `min_count` copies of one pattern of `min_pattern_size` (1 where 0) to `max_pattern_size` tokens
    (engine/repetition.py). A max_pattern_size of 0 detects nothing."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            _check_int(f"repetition_detection.{name}", getattr(self, name))
        if self.max_pattern_size < 0 or self.min_pattern_size < 0 or self.min_pattern_size > self.max_pattern_size:
            raise InvalidSamplingParamsError(
                f"repetition_detection: max_pattern_size={self.max_pattern_size} and min_pattern_size="
                f"{self.min_pattern_size} must be at least 0, min_pattern_size at most max_pattern_size (both 0: off)")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise InvalidSamplingParamsError(
                f"repetition_detection.min_count={self.min_count}: a pattern must repeat at least 2 times to be "
                "detected (max_pattern_size 0 turns detection off)")

    @property
    def active(self) -> bool:
        return self.max_pattern_size > 0


class RequestOutputKind(IntEnum):
    """vLLM's: what each output of a request carries. The offline LLM returns each request's final output
    alone (as vLLM's LLM sets FINAL_ONLY); the server streams what its API asks. Taken for vLLM's code to run."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


# vLLM's SamplingParams fields deltaserve takes only at their defaults: what each asks
UNHONOURED = {"flat_logprobs": "logprobs as flat lists",
              "extra_args": "arguments for logits processors (deltaserve runs none of the caller's)"}


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0  # before this many output tokens, no end of sequence, stop token or stop string ends it
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling
    allowed_token_ids: list[int] | None = None  # vLLM's: the only tokens the output may take
    bad_words: list[str] | None = None  # vLLM's: words the output may not write (each as its tokens, with and
    # without a leading space: the last token is refused where the output ends with the others)
    logprobs: int | None = None  # the sampled token's logprob and this many top ones (-1: the whole vocabulary)
    prompt_logprobs: int | None = None  # per prompt token: its logprob and the top ones (no prefix-cache hit)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM's: spaces between special tokens kept in the text. The Rust tokenizer's decoding writes none, as
    # vLLM's incremental detokenizer over a fast tokenizer does, so either value gives vLLM's text.
    spaces_between_special_tokens: bool = True
    detokenize: bool = True  # False: token ids only (no text, so no stop strings)
    structured_outputs: StructuredOutputsParams | None = None  # what the output must match (engine/grammar.py)
    # vLLM's: at most this many tokens in a think block, then its end is forced (engine/thinking_budget.py);
    # None or -1: no budget
    thinking_token_budget: int | None = None
    # vLLM's: True computes the whole prompt rather than take any of it from the prefix cache (None: as False, but
    # prompt_logprobs always need every prompt row computed); what it computes is still cached for others
    skip_reading_prefix_cache: bool | None = None
    # vLLM's: the logprobs of these tokens (at most MAX_LOGPROB_TOKEN_IDS) beside the sampled one's, every position
    logprob_token_ids: list[int] | None = None
    # vLLM's: the output ends once it repeats one pattern (a RepetitionDetectionParams, or a dict of its fields)
    repetition_detection: RepetitionDetectionParams | None = None
    # vLLM's fields that would change what is generated or returned, and that deltaserve does not honour: taken at
    # their defaults so that vLLM's code runs, refused by name otherwise (UNHONOURED)
    flat_logprobs: bool = False
    extra_args: dict | None = None
    # vLLM's, taken for its code to run: what each output carries (RequestOutputKind) and whether the engine
    # copies the parameters (it reads them as given)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    skip_clone: bool = False
    stop_strings: list[str] = field(init=False, repr=False)

    @classmethod
    def from_optional(cls, **fields) -> SamplingParams:
        """vLLM's: None for any field is its default, and logit_bias's keys are read as token ids and its biases
        clamped to OpenAI's [-100, 100]."""
        bias = fields.get("logit_bias")
        if isinstance(bias, dict):
            try:
                fields["logit_bias"] = {int(token): min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, value))
                                        for token, value in bias.items()}
            except (TypeError, ValueError):
                pass  # left as given: validate names what is wrong
        return cls(**{name: value for name, value in fields.items() if value is not None})

    def clone(self) -> SamplingParams:
        """vLLM's: a deep copy (a structured output's schema with it)."""
        return copy.deepcopy(self)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Checks every field and derives what the engine reads (stop_strings; a temperature too small to
        divide by as 0). The engine calls it again when a request is added, so fields set after
        construction are checked too."""
        for name, what in UNHONOURED.items():
            if getattr(self, name) not in (None, False, {}):
                raise InvalidSamplingParamsError(f"{name}={getattr(self, name)!r:.60}: {what} is not supported")
        def bad(name: str, value, why: str) -> InvalidSamplingParamsError:
            return InvalidSamplingParamsError(f"{name}={value!r}: {why}")

        try:
            self.output_kind = RequestOutputKind(self.output_kind)
        except ValueError:
            raise bad("output_kind", self.output_kind, "must be a RequestOutputKind") from None
        if self.bad_words is None:
            self.bad_words = []  # vLLM's: none is an empty list

        if self.stop is None:
            self.stop_strings = []
        elif isinstance(self.stop, str):
            self.stop = self.stop_strings = [self.stop]  # vLLM's: a string is a list of one
        elif isinstance(self.stop, (list, tuple)):
            self.stop_strings = list(self.stop)
        else:
            raise bad("stop", self.stop, "must be a string or a list of strings")
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif not isinstance(self.stop_token_ids, (list, tuple)):
            raise bad("stop_token_ids", self.stop_token_ids, "must be a list of token ids")
        self.stop_token_ids = list(self.stop_token_ids)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                     "spaces_between_special_tokens", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, getattr(self, name), "must be True or False")

        _check_int("n", self.n)
        if self.n < 1:
            raise bad("n", self.n, "must be at least 1")
        _check_number("temperature", self.temperature)
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise bad("temperature", self.temperature, f"must be in [0, {MAX_TEMPERATURE:g}] (0 means greedy)")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", self.top_p, "must be in (0, 1]")
        _check_int("top_k", self.top_k)
        if self.top_k < -1:  # 0 is off as -1 is (vLLM's default is 0)
            raise bad("top_k", self.top_k, "must be -1 or 0 (off) or a positive integer")
        _check_number("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", self.min_p, "must be in [0, 1]")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise bad("max_tokens", self.max_tokens, "must be at least 1")
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise bad("min_tokens", self.min_tokens, "must be at least 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", self.min_tokens, f"must be at most max_tokens ({self.max_tokens})")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value)
            if not -2.0 <= value <= 2.0:
                raise bad(name, value, "must be in [-2, 2]")
        _check_number("repetition_penalty", self.repetition_penalty)
        if not FLOAT32_TINY <= self.repetition_penalty <= FLOAT32_MAX:  # float32 0 or inf: logits of inf and NaN
            raise bad("repetition_penalty", self.repetition_penalty,
                      f"must be > 0, within float32's normal range [{FLOAT32_TINY:.4g}, {FLOAT32_MAX:.4g}]")
        if self.seed == -1 and not isinstance(self.seed, bool):  # vLLM's: -1 asks for no seed
            self.seed = None
        if self.seed is not None:
            _check_int("seed", self.seed)
            if not -(2**63) <= self.seed < 2**63:  # as vLLM's: past int64 a seed would wrap onto another's draws
                raise bad("seed", self.seed, "must be a 64-bit signed integer")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise bad("logit_bias", self.logit_bias, "must map token ids to numbers")
            for token, bias in self.logit_bias.items():
                _check_int("logit_bias", token)
                _check_number("logit_bias", bias)
                if not -FLOAT32_MAX <= bias <= FLOAT32_MAX:  # as vLLM's, any bias the float32 logits can add
                    raise bad("logit_bias", {token: bias}, "a bias must be within float32's range")
        if self.allowed_token_ids is not None:
            if not isinstance(self.allowed_token_ids, (list, tuple)) or not self.allowed_token_ids:
                raise bad("allowed_token_ids", self.allowed_token_ids, "must be a non-empty list of token ids")
            self.allowed_token_ids = list(self.allowed_token_ids)
            for t in self.allowed_token_ids:
                _check_int("allowed_token_ids", t)
        if self.bad_words:
            if not isinstance(self.bad_words, (list, tuple)) or not all(
                    isinstance(w, str) and w.strip() for w in self.bad_words):
                raise bad("bad_words", self.bad_words, "must be a list of non-empty strings")
            if any(LONE_SURROGATE.search(w) for w in self.bad_words):  # no tokenizer encodes one
                raise bad("bad_words", self.bad_words, "must be text: one holds a lone UTF-16 surrogate")
            self.bad_words = list(self.bad_words)
        if self.skip_reading_prefix_cache is not None and not isinstance(self.skip_reading_prefix_cache, bool):
            raise bad("skip_reading_prefix_cache", self.skip_reading_prefix_cache, "must be True, False or None")
        if self.logprob_token_ids is not None:
            if (not isinstance(self.logprob_token_ids, (list, tuple))
                    or len(self.logprob_token_ids) > MAX_LOGPROB_TOKEN_IDS):
                raise bad("logprob_token_ids", self.logprob_token_ids,
                          f"must be a list of at most {MAX_LOGPROB_TOKEN_IDS} token ids")
            self.logprob_token_ids = list(self.logprob_token_ids)
            for t in self.logprob_token_ids:
                _check_int("logprob_token_ids", t)
            if self.logprobs not in (None, len(self.logprob_token_ids)):  # vLLM's: the named tokens are the top
                raise bad("logprob_token_ids", self.logprob_token_ids,
                          f"with logprobs={self.logprobs} given too, logprobs must equal their number")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is True:  # vLLM's: True asks for one
                setattr(self, name, 1)
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value)
                if value < -1:  # how many the engine allows is its max_logprobs: check_logprobs
                    raise bad(name, value, "must be at least 0, or -1 for the whole vocabulary")
        if self.stop_strings and not self.detokenize:
            raise bad("stop", self.stop, "stop strings need detokenize=True")
        for s in self.stop_strings:
            if not isinstance(s, str) or not s:
                raise bad("stop", self.stop, "stop strings must be non-empty strings")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t)
        if self.thinking_token_budget is not None:
            _check_int("thinking_token_budget", self.thinking_token_budget)
            if self.thinking_token_budget < -1:
                raise bad("thinking_token_budget", self.thinking_token_budget,
                          "must be at least 0, or -1 for no budget")
            if self.thinking_token_budget == -1:
                self.thinking_token_budget = None
        if isinstance(self.repetition_detection, dict):  # the server's JSON, and vLLM's callers' dicts
            try:
                self.repetition_detection = RepetitionDetectionParams(**self.repetition_detection)
            except TypeError as exc:
                raise bad("repetition_detection", self.repetition_detection,
                          "takes max_pattern_size, min_pattern_size and min_count") from exc
        if self.repetition_detection is not None:
            if not isinstance(self.repetition_detection, RepetitionDetectionParams):
                raise bad("repetition_detection", self.repetition_detection, "must be a RepetitionDetectionParams")
            self.repetition_detection.validate()
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise bad("structured_outputs", self.structured_outputs, "must be a StructuredOutputsParams")
            self.structured_outputs.validate()
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE

    @property
    def returns_logprobs(self) -> bool:
        """Whether each output token comes with logprobs: its top ones (logprobs) or named ones (logprob_token_ids)."""
        return self.logprobs is not None or bool(self.logprob_token_ids)

    def check_logprobs(self, cap: int, vocab_size: int) -> None:
        """Refuses logprobs or prompt_logprobs asking more a token than `cap` (an engine's max_logprobs, resolved)."""
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                check_logprobs_count(name, getattr(self, name), cap, vocab_size)


def logprobs_count(value: int, vocab_size: int) -> int:
    """The top logprobs a token that `value` asks: -1 is the whole vocabulary."""
    return vocab_size if value == -1 else value


def check_logprobs_count(name: str, value: int, cap: int, vocab_size: int) -> None:
    """Refuses a request field asking more logprobs a token than `cap` allows (or a negative count but -1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidSamplingParamsError(f"{name}={value!r}: must be at least 0, or -1 for the whole vocabulary")
    count = logprobs_count(value, vocab_size)
    if count > cap:
        raise InvalidSamplingParamsError(
            f"{name}={value}: asks for {count} logprobs a token, more than the engine's "
            f"max_logprobs of {cap} allows (--max-logprobs or max_logprobs raises it; -1: the whole vocabulary)")


def _check_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSamplingParamsError(f"{name}={value!r}: must be an integer")


def _check_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidSamplingParamsError(f"{name}={value!r}: must be a number")
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidSamplingParamsError(f"{name}={value!r}: must be finite")


@dataclass
class BeamSearchParams:
    """vLLM's: a beam search keeping `beam_width` sequences, ranked by their summed logprobs over their length (with
    the prompt's tokens) to the power `length_penalty`. Every step takes each beam's 2 * beam_width likeliest next
    tokens, so the engine's max_logprobs bounds the width. temperature is taken as vLLM takes it: the beams are
    ranked by the model's own logprobs, which no temperature changes. stop_token_ids and min_tokens are
    deltaserve's, as SamplingParams reads them (a server request's)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None  # vLLM's; refused: no grammar constrains the beams
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in ("beam_width", "max_tokens", "min_tokens"):
            _check_int(name, getattr(self, name))
        if self.beam_width < 1 or self.max_tokens < 1 or self.min_tokens < 0:
            raise InvalidSamplingParamsError(
                f"beam_width={self.beam_width}, max_tokens={self.max_tokens}, min_tokens={self.min_tokens}: beam "
                "search needs a width and max_tokens of at least 1, and min_tokens of at least 0")
        for name in ("temperature", "length_penalty"):
            _check_number(name, getattr(self, name))
        if self.temperature < 0:
            raise InvalidSamplingParamsError(f"temperature={self.temperature}: must be at least 0")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidSamplingParamsError(f"{name}={getattr(self, name)!r}: must be true or false")
        if self.structured_outputs is not None:
            raise InvalidSamplingParamsError("structured_outputs: beam search takes no grammar (each beam's "
                                             "candidates are the model's likeliest tokens, unconstrained)")
        stops = self.stop_token_ids or []
        if not isinstance(stops, (list, tuple)) or any(isinstance(t, bool) or not isinstance(t, int) for t in stops):
            raise InvalidSamplingParamsError(f"stop_token_ids={self.stop_token_ids!r}: must be a list of token ids")
        self.stop_token_ids = list(stops)
