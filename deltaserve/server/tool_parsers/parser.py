"""ToolCallParser: splits a model's streamed text into plain text and tool calls.

A call is `<tool_call>BODY</tool_call>`; the body is either Qwen3's JSON object or the
`<function=NAME><parameter=P>...</parameter></function>` form of Qwen3.5 and Qwen3-Next, told
apart by its first characters. Text that might be the start of a tag is held back until the
next chunk decides it, so tags cut anywhere by the stream boundaries are still found. A body
that does not parse is given back as the text it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deltaserve.server.tool_parsers.qwen3_json import parse_json_tool_call
from deltaserve.server.tool_parsers.qwen3_xml import looks_like_xml_call, parse_xml_tool_call
from deltaserve.server.tool_parsers.tags import held_suffix_len
from deltaserve.server.tool_parsers.tool_call import ToolCall

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass
class ParsedDelta:
    """What one chunk of model text turned out to hold: its text and calls in the order written (`pieces`), and
    each kind alone."""

    pieces: list[str | ToolCall] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(p for p in self.pieces if isinstance(p, str))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.pieces if isinstance(p, ToolCall)]

    def add_text(self, text: str) -> None:
        if self.pieces and isinstance(self.pieces[-1], str):
            self.pieces[-1] += text
        elif text:
            self.pieces.append(text)

    def __bool__(self) -> bool:
        return bool(self.pieces)


def parse_tool_call_body(body: str, schemas: dict[str, dict] | None = None) -> ToolCall | None:
    if looks_like_xml_call(body):
        return parse_xml_tool_call(body, schemas)
    return parse_json_tool_call(body)


class ToolCallParser:
    """Feed text chunks in order; each feed returns the text and the calls now complete."""

    def __init__(self, schemas: dict[str, dict] | None = None):
        self.schemas = schemas or {}
        self.calls: list[ToolCall] = []
        self._inside = False
        self._buffer = ""  # held text: a possible tag start outside, the body inside
        self._pending_space = ""  # whitespace after a call, emitted only if text follows
        self._segment_has_text = False  # text other than whitespace since the last call

    def feed(self, chunk: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buffer += chunk
        while True:
            if self._inside:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    break
                self._close_call(self._buffer[:end], out)
                self._buffer = self._buffer[end + len(CLOSE):]
            else:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = held_suffix_len(self._buffer, OPEN)
                    self._emit_text(self._buffer[: len(self._buffer) - keep], out)
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                self._emit_text(self._buffer[:start], out)
                self._buffer = self._buffer[start + len(OPEN):]
                self._inside = True
        return out

    def finish(self) -> ParsedDelta:
        """Flush at the end of the output: an unclosed call is kept if its body parses."""
        out = ParsedDelta()
        if self._inside:
            self._inside = False
            call = parse_tool_call_body(self._buffer, self.schemas)
            if call is not None:
                self._add_call(call, out)
            else:
                self._emit_text(OPEN + self._buffer, out)
        else:
            self._emit_text(self._buffer, out)
        self._buffer = ""
        self._pending_space = ""  # whitespace alone after the last call: layout
        return out

    def _close_call(self, body: str, out: ParsedDelta) -> None:
        self._inside = False
        call = parse_tool_call_body(body, self.schemas)
        if call is None:
            self._emit_text(OPEN + body + CLOSE, out)
        else:
            self._add_call(call, out)

    def _add_call(self, call: ToolCall, out: ParsedDelta) -> None:
        self.calls.append(call)
        out.pieces.append(call)
        self._pending_space = ""
        self._segment_has_text = False

    def _emit_text(self, text: str, out: ParsedDelta) -> None:
        """Text outside calls. Between or after calls, a stretch of whitespace alone is layout: it is held until
        text follows it, and dropped where a call or the end does; once a stretch has text, all of it is text,
        whichever pieces it comes in."""
        if not text:
            return
        if self.calls and not self._segment_has_text and not text.strip():
            self._pending_space += text
            return
        out.add_text(self._pending_space + text)
        self._pending_space = ""
        self._segment_has_text = True
