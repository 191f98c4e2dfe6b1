"""ChoiceParser: one choice's streamed text -> reasoning, answer text and tool calls."""

from __future__ import annotations

from dataclasses import dataclass, field

from deltaserve.server.forced_tool_calls import ForcedToolCalls
from deltaserve.server.reasoning import ReasoningSplitter
from deltaserve.server.tool_parsers import TAGS, ToolCall, tool_call_parser


@dataclass
class AnswerText:
    """A stretch of the answer's text, with the logprobs of the tokens that wrote it where a reader places them
    (message_logprobs.MessageLogprobs)."""

    text: str
    logprobs: list[dict] = field(default_factory=list)


class ChoiceDelta:
    """What a stretch of one choice's output holds: reasoning (it comes first), then the answer's text and tool
    calls in the order written (`answer`). Chat's reply reads the text and the calls apart (`content`,
    `tool_calls`); the Responses and Messages replies place them in order, as items and blocks."""

    def __init__(self, reasoning: str = "", content: str = "", tool_calls: list[ToolCall] | None = None,
                 answer: list[AnswerText | ToolCall] | None = None):
        self.reasoning = reasoning
        self.answer: list[AnswerText | ToolCall] = list(answer or ())
        if content:
            self.answer.insert(0, AnswerText(content))
        self.answer += tool_calls or ()

    @property
    def content(self) -> str:
        return "".join(p.text for p in self.answer if isinstance(p, AnswerText))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.answer if isinstance(p, ToolCall)]

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.answer)

    def __repr__(self) -> str:
        return f"ChoiceDelta(reasoning={self.reasoning!r}, answer={self.answer!r})"

    def extend(self, other: ChoiceDelta) -> None:
        self.reasoning += other.reasoning
        for piece in other.answer:
            last = self.answer[-1] if self.answer else None
            if isinstance(piece, AnswerText) and isinstance(last, AnswerText):
                last.text += piece.text  # this delta's own copy: a whole reply merges token by token
                last.logprobs += piece.logprobs
            else:  # a text kept as a copy, so that merging into it changes no other delta
                self.answer.append(AnswerText(piece.text, list(piece.logprobs)) if isinstance(piece, AnswerText)
                                   else piece)


class ChoiceParser:
    """Reasoning is split off first; tool calls are looked for in the answer only."""

    def __init__(
        self,
        *,
        reasoning: bool = False,
        start_in_reasoning: bool = False,
        tool_schemas: dict[str, dict] | None = None,
        forced: ForcedToolCalls | None = None,
        max_calls: int | None = None,
        tool_format: str = TAGS,
    ):
        """forced: the answer is the JSON of a demanded tool call (forced_tool_calls.py), not text.
        max_calls: the most tool calls the reply may make (None: any number); the calls after them are dropped,
        their text with them, as vLLM drops them (OpenAI's parallel_tool_calls false: one call at most).
        tool_format: how the model writes its calls (tool_parsers.tool_format_of)."""
        self._splitter = ReasoningSplitter(start_in_reasoning) if reasoning else None
        self._tools = (tool_call_parser(tool_format, tool_schemas) if tool_schemas is not None and forced is None
                       else None)
        self._forced = forced
        self._max_calls = max_calls
        self.tool_calls: list[ToolCall] = []  # the calls kept so far
        self.calls_read = 0  # every call read so far, those past max_calls too

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far ends inside the reasoning (or just after its end, where the answer has not
        begun)."""
        return self._splitter is not None and self._splitter.in_reasoning

    def feed(self, text: str) -> ChoiceDelta:
        if self._splitter is None:
            return self._answer(text, final=False)
        split = self._splitter.feed(text)
        out = ChoiceDelta(reasoning=split.reasoning)
        out.extend(self._answer(split.content, final=False))
        return out

    def finish(self) -> ChoiceDelta:
        out = ChoiceDelta()
        if self._splitter is not None:
            split = self._splitter.finish()
            out.reasoning = split.reasoning
            out.extend(self._answer(split.content, final=False))
        out.extend(self._answer("", final=True))
        return out

    def _answer(self, text: str, *, final: bool) -> ChoiceDelta:
        if self._forced is not None:
            self._forced.feed(text)
            if not final:
                return ChoiceDelta()
            content, calls = self._forced.finish()
            return ChoiceDelta(content=content, tool_calls=self._kept(calls))
        if self._tools is None:
            return ChoiceDelta(content=text)
        parsed = self._tools.finish() if final else self._tools.feed(text)
        kept = {id(call) for call in self._kept(parsed.tool_calls)}
        return ChoiceDelta(answer=[AnswerText(p) if isinstance(p, str) else p for p in parsed.pieces
                                   if isinstance(p, str) or id(p) in kept])

    def _kept(self, calls: list[ToolCall]) -> list[ToolCall]:
        """The calls within max_calls, in the order they came."""
        self.calls_read += len(calls)
        room = len(calls) if self._max_calls is None else max(self._max_calls - len(self.tool_calls), 0)
        kept = calls[:room]
        self.tool_calls.extend(kept)
        return kept
