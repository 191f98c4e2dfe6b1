"""ToolCallParser: splits a model's streamed text into plain text and tool calls.

A call is `<tool_call>BODY</tool_call>`; the body is either Qwen3's JSON object or the
`<function=NAME><parameter=P>...</parameter></function>` form of Qwen3.5 and Qwen3-Next, told
apart by its first characters (the XML form may hold several functions, each a call). As vLLM's
qwen3_coder parser, a `<function=...>...</function>` written without the `<tool_call>` around it is
a call too, and a `</tool_call>` left after it is dropped. Text that might be the start of a tag is
held back until the next chunk decides it, so tags cut anywhere by the stream boundaries are still
found. A body that does not parse is given back as the text it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deltaserve.server.tool_parsers.qwen3_json import parse_json_tool_call
from deltaserve.server.tool_parsers.qwen3_xml import (FUNCTION_CLOSE, FUNCTION_OPEN, looks_like_xml_call,
                                                      parse_xml_tool_calls)
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


def parse_tool_call_body(body: str, schemas: dict[str, dict] | None = None) -> list[ToolCall] | None:
    """The calls of the text between the tags; None where it is no well-formed call."""
    if looks_like_xml_call(body):
        return parse_xml_tool_calls(body, schemas)
    call = parse_json_tool_call(body)
    return None if call is None else [call]


class ToolCallParser:
    """Feed text chunks in order; each feed returns the text and the calls now complete."""

    def __init__(self, schemas: dict[str, dict] | None = None):
        self.schemas = schemas or {}
        self.calls: list[ToolCall] = []
        self._inside = False
        self._bare = False  # inside a <function=...> that no <tool_call> opened (its body keeps its tags)
        self._after_bare = False  # a bare function just closed: a </tool_call> after it closes nothing
        self._buffer = ""  # held text: a possible tag start outside, the body inside
        self._pending_space = ""  # whitespace after a call, emitted only if text follows
        self._segment_has_text = False  # text other than whitespace since the last call

    def feed(self, chunk: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buffer += chunk
        while True:
            if self._inside:
                close = FUNCTION_CLOSE if self._bare else CLOSE
                end = self._buffer.find(close)
                if end < 0:
                    break
                self._close_call(self._buffer[: end + len(close) if self._bare else end], out)
                self._buffer = self._buffer[end + len(close):]
            elif self._after_bare and not self._skip_stray_close():
                break  # the rest may yet be a </tool_call>
            else:
                start, tag = self._next_open()
                if start < 0:
                    keep = max(held_suffix_len(self._buffer, OPEN), held_suffix_len(self._buffer, FUNCTION_OPEN))
                    self._emit_text(self._buffer[: len(self._buffer) - keep], out)
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                self._emit_text(self._buffer[:start], out)
                self._bare = tag == FUNCTION_OPEN
                self._buffer = self._buffer[start if self._bare else start + len(OPEN):]
                self._inside = True
        return out

    def _next_open(self) -> tuple[int, str]:
        """Where the first call opens in the buffer, and by which tag; -1 where none does."""
        found = [(at, tag) for tag in (OPEN, FUNCTION_OPEN) if (at := self._buffer.find(tag)) >= 0]
        return min(found) if found else (-1, OPEN)

    def _skip_stray_close(self) -> bool:
        """After a bare function: drops a </tool_call> that follows it (past whitespace). False while the buffer
        may still become one."""
        rest = self._buffer.lstrip()
        if rest.startswith(CLOSE):
            self._buffer = rest[len(CLOSE):]
        elif CLOSE.startswith(rest):  # empty, or a start of the tag
            return False
        self._after_bare = False
        return True

    def finish(self) -> ParsedDelta:
        """Flush at the end of the output: a call that <tool_call> opened and nothing closed is kept if its body
        parses."""
        out = ParsedDelta()
        if self._inside:
            self._inside = False
            # an unclosed call counts where <tool_call> opened it; a bare function only once closed
            calls = None if self._bare else parse_tool_call_body(self._buffer, self.schemas)
            if calls is not None:
                self._add_calls(calls, out)
            else:
                self._emit_text(self._buffer if self._bare else OPEN + self._buffer, out)
        elif not self._after_bare or self._buffer.strip():
            self._emit_text(self._buffer, out)
        self._buffer = ""
        if not self.calls:  # whitespace alone, and no call: the answer's own
            out.add_text(self._pending_space)
        self._pending_space = ""  # whitespace alone before, between or after calls: layout
        return out

    def _close_call(self, body: str, out: ParsedDelta) -> None:
        self._inside = False
        calls = parse_tool_call_body(body, self.schemas)
        if calls is None:
            self._emit_text(body if self._bare else OPEN + body + CLOSE, out)
        else:
            self._add_calls(calls, out)
            self._after_bare = self._bare

    def _add_calls(self, calls: list[ToolCall], out: ParsedDelta) -> None:
        self.calls += calls
        out.pieces += calls
        self._pending_space = ""
        self._segment_has_text = False

    def _emit_text(self, text: str, out: ParsedDelta) -> None:
        """Text outside calls. Before, between or after calls, a stretch of whitespace alone is layout: it is held
        until text follows it, and dropped where a call or the end does (an answer of whitespace alone and no call
        keeps it); once a stretch has text, all of it is text, whichever pieces it comes in."""
        if not text:
            return
        if not self._segment_has_text and not text.strip():
            self._pending_space += text
            return
        out.add_text(self._pending_space + text)
        self._pending_space = ""
        self._segment_has_text = True
