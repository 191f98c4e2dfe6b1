"""WholeAnswerToolParser: for the formats whose tool calls are the whole answer (Llama's bare JSON, the pythonic
list): the answer's first characters decide. One that opens as such calls do is held to its end and read as
calls, given back whole as text where any part of it is not a call; any other answer streams as text."""

from __future__ import annotations

from collections.abc import Callable

from deltaserve.server.tool_parsers.parser import ParsedDelta
from deltaserve.server.tool_parsers.tool_call import ToolCall


class WholeAnswerToolParser:
    """Feed text chunks in order; each feed returns the text and the calls now complete (ToolCallParser's
    interface). `openings`: how an answer of calls starts (after any white space); `parse`: the calls an answer
    so opened is made of, or None where it is not calls alone."""

    def __init__(self, openings: tuple[str, ...], parse: Callable[[str], list[ToolCall] | None]):
        self.openings = openings
        self.parse = parse
        self.calls: list[ToolCall] = []
        self._held = ""  # the answer so far, while it may be (or is) calls
        self._calling: bool | None = None  # None: its first characters have not decided yet

    def feed(self, chunk: str) -> ParsedDelta:
        if self._calling is False:
            return ParsedDelta([chunk] if chunk else [])
        self._held += chunk
        if self._calling is None:
            opening = self._held.lstrip()
            if not opening or any(start.startswith(opening) for start in self.openings):
                return ParsedDelta()  # blank so far, or the first characters of an opening
            self._calling = opening.startswith(self.openings)
            if not self._calling:
                text, self._held = self._held, ""
                return ParsedDelta([text] if text else [])
        return ParsedDelta()

    def finish(self) -> ParsedDelta:
        text, self._held = self._held, ""
        calls = self.parse(text) if self._calling else None
        if calls is None:
            return ParsedDelta([text] if text else [])
        self.calls.extend(calls)
        return ParsedDelta(list(calls))
