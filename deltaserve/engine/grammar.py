"""Structured outputs: a request's output held to a JSON schema, any JSON object, a regular expression, a
choice of strings or a context-free grammar. Each such request carries a RequestGrammar, an llguidance
matcher over the model's vocabulary: before a step samples, the sampler masks the tokens that would leave the
grammar (`fill_masks`), and each token taken advances the matcher (`accept`). Where the grammar can go no
further the request stops.

The vocabulary's view for llguidance (its LLTokenizer, grammar_vocabulary.py) is built once per engine, on the
first request that asks for a grammar (about half a second for a 49k vocabulary); a grammar is compiled when
its request is added, so a schema that does not compile is refused then, naming llguidance's reason."""

from __future__ import annotations

import copy
import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable

import torch

from deltaserve.engine.closed_schema import closed_objects
from deltaserve.engine.finite_json_schema import admits_a_finite_value
from deltaserve.engine.grammar_vocabulary import ll_tokenizer
from deltaserve.errors import InvalidSamplingParamsError
from deltaserve.sampling_params import StructuredOutputsParams


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar of what `params` asks for."""
    from llguidance import LLMatcher

    if params.json is not None:
        schema = params.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise InvalidSamplingParamsError(f"structured_outputs.json: not JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise InvalidSamplingParamsError("structured_outputs.json: a JSON schema must be an object")
        try:
            return LLMatcher.grammar_from_json_schema(
                closed_objects(schema),
                defaults=_json_layout(params))
        except (TypeError, ValueError) as exc:  # a value JSON cannot hold (offline callers may pass any dict)
            raise InvalidSamplingParamsError(f"structured_outputs.json: not a JSON schema: {exc}") from None
    if params.json_object:
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_json_layout(params))
    if params.regex is not None:
        return LLMatcher.grammar_from_regex(params.regex)
    if params.grammar is not None:
        from llguidance import grammar_from

        try:  # Lark as it is; GBNF (rules written `name ::= ...`) converted to Lark
            return grammar_from("grammar", params.grammar)
        except ValueError as exc:
            raise InvalidSamplingParamsError(f"structured_outputs.grammar: {_one_line(str(exc))}") from None
    return LLMatcher.grammar_from_lark(_choice_lark(params.choice))


# llguidance's parser holds at most 2000 items in a row, and a rule of choices keeps one per choice alive:
# past this many choices they are one terminal, which the lexer matches instead
CHOICES_IN_A_RULE = 1000


def _choice_lark(choices: list[str]) -> str:
    """A Lark grammar matching exactly one of `choices` (string literals take JSON's escapes, so each is matched
    as its text)."""
    literals = " | ".join(json.dumps(c) for c in choices)
    if len(choices) <= CHOICES_IN_A_RULE:
        return "start: " + literals
    return f"start: CHOICE\nCHOICE: {literals}"


def _json_layout(params: StructuredOutputsParams) -> dict | None:
    """llguidance's JSON options for the whitespace a request allows (its schema's own "x-guidance" wins)."""
    if params.whitespace_pattern is not None:
        return {"whitespace_pattern": params.whitespace_pattern}
    return {"whitespace_flexible": False} if params.disable_any_whitespace else None


COMPILED_KEPT = 64


class GrammarCompiler:
    """Compiles requests' structured_outputs against one tokenizer and vocabulary."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids: Iterable[int], encode):
        self._hf = hf_tokenizer
        self.vocab_size = vocab_size  # the logits' width: ids past the tokenizer's are never allowed
        self._eos = sorted(eos_token_ids)
        self._encode = encode  # text -> token ids without special tokens (start_after's)
        self._lock = threading.Lock()  # the compiled grammars'
        self._build_lock = threading.Lock()  # the LLTokenizer's, held while it is built (seconds at most)
        self._ll_tokenizer = None
        self._compiled: OrderedDict[str, str] = OrderedDict()  # _spec_key -> grammar text, oldest first

    def ll_tokenizer(self):
        """llguidance's view of the vocabulary, built on first use: by the server's check, off the event loop,
        or by the engine thread for an offline request."""
        with self._build_lock:
            if self._ll_tokenizer is None:
                try:
                    self._ll_tokenizer = ll_tokenizer(self._hf, self.vocab_size, self._eos)
                except ModuleNotFoundError as exc:
                    if exc.name != "llguidance":
                        raise
                    raise InvalidSamplingParamsError("structured outputs need the llguidance package, which is "
                                                     "not installed") from exc
            return self._ll_tokenizer

    def compile(self, params: StructuredOutputsParams) -> str:
        """The request's grammar, checked: a schema, regex or choice that does not compile is refused here.
        The newest COMPILED_KEPT grammars are kept: the server checks a request's before the engine thread
        takes it, and clients send the same schema again and again."""
        from llguidance import LLMatcher

        try:
            key = _spec_key(params)
            with self._lock:
                text = self._compiled.get(key)
                if text is not None:
                    self._compiled.move_to_end(key)
                    return text
            text = grammar_text(params)
        except RecursionError:  # a schema nested past Python's stack (llguidance refuses less deep ones itself)
            raise InvalidSamplingParamsError("structured_outputs.json: the schema nests too deeply") from None
        error = LLMatcher.validate_grammar(text, self.ll_tokenizer())
        if error and not error.startswith("WARNING"):
            raise InvalidSamplingParamsError(f"structured_outputs: {_one_line(error)}")
        self._check_writable(text)
        _check_finite(text)
        with self._lock:
            self._compiled[key] = text
            while len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return text

    def _check_writable(self, text: str) -> None:
        """A grammar that compiles may still admit nothing (a schema that is only a reference to itself): its
        matcher fails at the first token, where a request would end at once with an empty, unmatched output."""
        from llguidance import LLMatcher

        probe = LLMatcher(self.ll_tokenizer(), text, log_level=0)
        probe.compute_logit_bias()
        if probe.is_error():
            first = probe.get_error().split("\n", 1)[0]
            raise InvalidSamplingParamsError(f"structured_outputs: nothing can be written under it ({first})")

    def matcher(self, params: StructuredOutputsParams, text: str,
                think_tags: tuple[int, int] | None = None) -> RequestGrammar:
        """A fresh RequestGrammar over a grammar `compile` returned (one per sequence: each advances alone); with
        `think_tags`, its first token may open a think block (RequestGrammar)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.ll_tokenizer(), text, log_level=0)
        if matcher.is_error():
            raise InvalidSamplingParamsError(f"structured_outputs: {_one_line(matcher.get_error())}")
        start_after = self._encode(params.start_after) if params.start_after is not None else None
        return RequestGrammar(matcher, start_after, think_tags)


def _check_finite(text: str) -> None:
    """A schema may admit only values that nest without end (its matcher takes `{"a":{"a":...` for ever): a
    request under it could never finish, so it is refused (`finite_json_schema`)."""
    schema = _json_schema_in(text)
    if schema is not None and not admits_a_finite_value(schema):
        raise InvalidSamplingParamsError(
            "structured_outputs: the schema admits no finite value (each value it allows must nest another "
            "without end, through required properties, required items or references)")


def _json_schema_in(text: str):
    """The JSON schema of a grammar that `grammar_text` made of one (llguidance expands it), or None."""
    if not text.lstrip().startswith("{"):  # Lark
        return None
    try:
        grammars = json.loads(text).get("grammars")
    except (ValueError, AttributeError, RecursionError):
        return None
    if isinstance(grammars, list) and len(grammars) == 1 and isinstance(grammars[0], dict):
        return grammars[0].get("json_schema")
    return None


class RequestGrammar:
    """One sequence's matcher. With `start_after` (token ids) it waits, free, until the output ends with them.
    With `think_tags` ((<think>, </think>) ids: a prompt that holds neither, to a model that thinks), the first
    token may also be the <think> that opens a think block, and then the grammar waits, free, for its </think>
    (unless the grammar takes that <think> itself)."""

    def __init__(self, matcher, start_after: list[int] | None = None, think_tags: tuple[int, int] | None = None):
        self.matcher = matcher
        self._waiting_for = list(start_after) if start_after else None
        self._recent: list[int] = []  # the output's last tokens while waiting
        self._think_tags = think_tags  # until the first token is taken

    @property
    def think_opening(self) -> int | None:
        """A token the next one may be beside those the grammar allows (the first token's <think>), or None."""
        return self._think_tags[0] if self._think_tags is not None and self.active else None

    @property
    def active(self) -> bool:
        """Whether the grammar holds the next token."""
        return self._waiting_for is None

    @property
    def matches_alone(self) -> bool:
        """Whether its matcher alone decides the next tokens: it holds them, with no think block to open."""
        return self.active and self._think_tags is None

    @property
    def finished(self) -> bool:
        """Whether the output is complete: the grammar accepts nothing more (but an end of sequence)."""
        return self.active and self.matcher.is_stopped()

    def accept(self, token: int) -> bool:
        """Takes the output's next token; False where the grammar refuses it."""
        if self._think_tags is not None:
            start, end = self._think_tags
            self._think_tags = None
            # a grammar that takes the <think> itself (one that holds the think block) keeps it
            if token == start and self.active and self.matcher.validate_tokens([token]) == 0:
                self._waiting_for = [end]
                return True
        if not self.active:
            self._recent = (self._recent + [token])[-len(self._waiting_for):]
            if self._recent == self._waiting_for:
                self._waiting_for = None
            return True
        return self.matcher.consume_token(token)

    def error(self) -> str:
        return self.matcher.get_error()

    def fill_masks_along(self, drafts: list[int], bitmask: torch.Tensor, first_row: int) -> None:
        """Rows first_row .. first_row + len(drafts) of `bitmask` (int32 on the host): row j what the grammar
        allows after drafts[:j] were taken (all ones where it is not holding the token yet, as a sampler leaves
        such a row unmasked). Rows past a draft it refuses allow everything: the verifier never reaches them,
        that draft being masked. The grammar itself stays where it is: a copy takes the drafts."""
        import llguidance.torch

        shadow = copy.copy(self)  # accept() replaces its lists, never changes them in place
        shadow.matcher = self.matcher.deep_copy()
        for j in range(len(drafts) + 1):
            row = first_row + j
            if shadow.active:
                llguidance.torch.fill_next_token_bitmask(shadow.matcher, bitmask, row)
                if (token := shadow.think_opening) is not None:
                    allow_token(bitmask[row], token)
            else:
                bitmask[row] = -1
            if j < len(drafts) and not shadow.accept(drafts[j]):
                bitmask[row + 1 : first_row + len(drafts) + 1] = -1
                return


def fill_masks(grammars: list[RequestGrammar], bitmask: torch.Tensor) -> None:
    """bitmask[i] (int32 on the host) = what grammars[i] allows next. llguidance fills the rows on its own
    threads, outside the GIL (benchmarks/grammar_mask_host.py: at 128 rows a step's median fill took about 1.0
    against 1.25 ms one row after another, on two cores)."""
    import llguidance.torch

    llguidance.torch.fill_next_token_bitmask_par(_executor(), [(g.matcher, row) for row, g in enumerate(grammars)],
                                                 bitmask)
    for row, grammar in enumerate(grammars):
        if (token := grammar.think_opening) is not None:
            allow_token(bitmask[row], token)


def fill_masks_along_drafts(sequences: list[tuple[RequestGrammar, int, list[int]]], bitmask: torch.Tensor) -> None:
    """For each (grammar, first row, drafts): RequestGrammar.fill_masks_along into `bitmask`. The grammars that
    hold their next token with nothing of their own to follow (no think block to wait for or to open) are filled by
    llguidance on its threads, each matcher taking the drafts and giving them back itself; a verify step's rows are
    (k + 1) times a plain step's, which one row after another would fill that many times slower."""
    import llguidance.torch

    batched, alone = [], []
    for grammar, first, drafts in sequences:
        (batched if grammar.matches_alone else alone).append((grammar, first, drafts))
    for grammar, first, drafts in alone:
        grammar.fill_masks_along(drafts, bitmask, first)
    with_drafts = [(g.matcher, first, drafts) for g, first, drafts in batched if drafts]
    if with_drafts:
        llguidance.torch.fill_next_token_bitmask_par_with_draft_tokens(_executor(), with_drafts, bitmask)
    without = [(g.matcher, first) for g, first, drafts in batched if not drafts]
    for matcher, first in without:
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, first)
    for matcher, first, drafts in with_drafts:
        valid = matcher.validate_tokens(drafts)
        bitmask[first + valid + 1 : first + len(drafts) + 1] = -1  # past a refused draft: never reached


def allow_token(mask_row: torch.Tensor, token: int) -> None:
    """Sets `token`'s bit (bit t % 32 of word t // 32) in a host mask row of int32 words."""
    word = int(mask_row[token // 32]) & 0xFFFFFFFF | 1 << token % 32
    mask_row[token // 32] = word - (1 << 32) if word >= 1 << 31 else word


@functools.cache
def _executor():
    import llguidance

    return llguidance.LLExecutor()


def mask_shape(rows: int, vocab_size: int) -> tuple[int, int]:
    return rows, -(-vocab_size // 32)


def _spec_key(params: StructuredOutputsParams) -> str:
    """What the grammar depends on, as text (start_after is the matcher's, not the grammar's)."""
    return json.dumps([params.json, params.json_object, params.regex, params.choice, params.grammar,
                       params.disable_any_whitespace, params.whitespace_pattern, params.disable_additional_properties],
                      sort_keys=True, default=repr)


def _one_line(message: str) -> str:
    """llguidance's message (a regex's spans over several lines) on one line, at most 400 characters."""
    return " ".join(message.split())[:400] or "the grammar does not compile"
