"""A choice's output read into reasoning, message text and tool calls, with the logprobs of the tokens that wrote
the message text (the Responses API's output_text logprobs): streamed in steps of any size or whole, the same."""

from __future__ import annotations

from collections.abc import Callable

from deltaserve.engine.detokenizer import IncrementalDetokenizer
from deltaserve.outputs import CompletionOutput
from deltaserve.sampling_params import SamplingParams
from deltaserve.server.output_parser import AnswerText, ChoiceDelta, ChoiceParser

# (output, first token, end) -> the logprobs of those tokens, one entry each
LogprobsOf = Callable[[CompletionOutput, int, int], list[dict]]


class TextFeed:
    """The output's new text to the parser in one piece: where no logprobs are asked."""

    def __init__(self, parser: ChoiceParser):
        self.parser = parser
        self._sent = 0

    def feed(self, o: CompletionOutput) -> tuple[ChoiceDelta, list[dict]]:
        delta = self.parser.feed(o.text[self._sent:])
        self._sent = len(o.text)
        if o.finish_reason is not None:
            delta.extend(self.parser.finish())
        return delta, []


class MessageLogprobs:
    """The output's text to the parser one token's text at a time, so that each token's logprobs go with the
    message text it wrote. A token whose text the parser holds (a tag that may be starting) waits for what that
    text turns out to be; tokens that end in the reasoning or in a tool call's markup have no place in the
    message. Tokens are cut where the engine's detokenizer cuts them, whatever the steps the output came in."""

    def __init__(self, parser: ChoiceParser, logprobs_of: LogprobsOf, tokenizer, prompt_token_ids: list[int],
                 skip_special_tokens: bool):
        self.parser = parser
        self._logprobs_of = logprobs_of
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids,
                                                   SamplingParams(skip_special_tokens=skip_special_tokens))
        self._token_ends: list[int] = []  # where each token's text ends in the output's text
        self._fed_tokens = 0  # the tokens whose text the parser has had whole
        self._fed_chars = 0
        self._waiting_from = 0  # the first fed token that has gone to no message text (nor been ruled out) yet
        self._calls_read = 0

    def feed(self, o: CompletionOutput) -> tuple[ChoiceDelta, list[dict]]:
        """What the output's new text holds, and the logprobs of the message text in it."""
        for token in o.token_ids[len(self._token_ends):]:
            self._detokenizer.append(token)
            self._token_ends.append(len(self._detokenizer.text))
        delta, placed = ChoiceDelta(), []
        shown = len(o.text)
        while self._fed_tokens < len(self._token_ends) and self._token_ends[self._fed_tokens] <= shown:
            self._fed_tokens += 1
            self._read(o, o.text[self._fed_chars:self._token_ends[self._fed_tokens - 1]], delta, placed)
        if self._fed_chars < shown:  # a token's text in part: the engine holds the rest while a stop string may form
            self._read(o, o.text[self._fed_chars:], delta, placed)
        if o.finish_reason is not None:
            self._fed_tokens = len(self._token_ends)  # with those whose text a stop string cut
            self._place(o, self.parser.finish(), delta, placed, final=True)
        return delta, placed

    def _read(self, o: CompletionOutput, text: str, delta: ChoiceDelta, placed: list[dict]) -> None:
        self._fed_chars += len(text)
        self._place(o, self.parser.feed(text), delta, placed)

    def _place(self, o: CompletionOutput, got: ChoiceDelta, delta: ChoiceDelta, placed: list[dict],
               final: bool = False) -> None:
        """The waiting tokens go with the message text they gave (the first stretch of it, where one token's text
        holds a call between two), or nowhere where they gave reasoning or calls."""
        called, self._calls_read = self._calls_read != self.parser.calls_read, self.parser.calls_read
        if got.content:
            logprobs = self._logprobs_of(o, self._waiting_from, self._fed_tokens)
            next(p for p in got.answer if isinstance(p, AnswerText) and p.text).logprobs += logprobs
            placed += logprobs
        delta.extend(got)
        if got.content or final or called or self.parser.in_reasoning:
            self._waiting_from = self._fed_tokens  # else still held: what they are comes with a later token
