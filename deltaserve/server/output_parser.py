"""ChoiceParser: one choice's streamed text -> reasoning, answer text and tool calls."""

from __future__ import annotations

from dataclasses import dataclass, field

from deltaserve.server.forced_tool_calls import ForcedToolCalls
from deltaserve.server.reasoning import ReasoningSplitter
from deltaserve.server.tool_parsers import ToolCall, ToolCallParser


@dataclass
class ChoiceDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: ChoiceDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)


class ChoiceParser:
    """Reasoning is split off first; tool calls are looked for in the answer only."""

    def __init__(
        self,
        *,
        reasoning: bool = False,
        start_in_reasoning: bool = False,
        tool_schemas: dict[str, dict] | None = None,
        forced: ForcedToolCalls | None = None,
    ):
        """forced: the answer is the JSON of a demanded tool call (forced_tool_calls.py), not text."""
        self._splitter = ReasoningSplitter(start_in_reasoning) if reasoning else None
        self._tools = ToolCallParser(tool_schemas) if tool_schemas is not None and forced is None else None
        self._forced = forced

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools else []

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
            return ChoiceDelta(content=content, tool_calls=calls)
        if self._tools is None:
            return ChoiceDelta(content=text)
        parsed = self._tools.finish() if final else self._tools.feed(text)
        return ChoiceDelta(content=parsed.text, tool_calls=parsed.tool_calls)
