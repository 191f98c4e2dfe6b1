"""ReasoningSplitter: separates `<think>...</think>` from the answer in streamed text.

Qwen3-family templates may open the think block inside the prompt (the generation prompt
ends with `<think>`), so the output starts inside reasoning without an opening tag; otherwise
an output that begins (after whitespace) with `<think>` enters reasoning. The reasoning ends at
`</think>`, or where a `<tool_call>` opens inside it (the call is the answer's, as vLLM's Qwen3 parser
reads a call made straight from the reasoning). Tags cut by chunk boundaries are held back until the
next chunk decides them.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltaserve.engine.thinking_budget import THINK_END as THINK_CLOSE
from deltaserve.engine.thinking_budget import THINK_START as THINK_OPEN
from deltaserve.server.tool_parsers.parser import OPEN as TOOL_CALL_OPEN
from deltaserve.server.tool_parsers.tags import held_suffix_len


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """True when the rendered prompt leaves a think block open for the model to continue."""
    tail = prompt_text.rstrip()
    return tail.endswith(THINK_OPEN)


class ReasoningSplitter:
    def __init__(self, start_in_reasoning: bool = False):
        self._state = "reasoning" if start_in_reasoning else "start"
        self._buffer = ""

    @property
    def in_reasoning(self) -> bool:
        """Inside the think block, or past its end where only the newlines before the answer have come."""
        return self._state in ("reasoning", "after_reasoning")

    def feed(self, chunk: str) -> ReasoningDelta:
        out = ReasoningDelta()
        self._buffer += chunk
        while self._buffer:
            if self._state == "start":
                stripped = self._buffer.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._buffer = stripped[len(THINK_OPEN):]
                    self._state = "reasoning"
                elif THINK_OPEN.startswith(stripped):
                    break  # only whitespace or a partial tag so far
                else:
                    self._state = "content"
            elif self._state == "reasoning":
                end, call = self._buffer.find(THINK_CLOSE), self._buffer.find(TOOL_CALL_OPEN)
                if call >= 0 and (end < 0 or call < end):  # a call made from the reasoning ends it
                    out.reasoning += self._buffer[:call]
                    self._buffer = self._buffer[call:]
                    self._state = "content"
                elif end >= 0:
                    out.reasoning += self._buffer[:end]
                    self._buffer = self._buffer[end + len(THINK_CLOSE):]
                    self._state = "after_reasoning"
                else:
                    keep = max(held_suffix_len(self._buffer, THINK_CLOSE),
                               held_suffix_len(self._buffer, TOOL_CALL_OPEN))
                    out.reasoning += self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
            elif self._state == "after_reasoning":
                stripped = self._buffer.lstrip("\n")
                if not stripped:
                    self._buffer = ""
                    break
                self._buffer = stripped
                self._state = "content"
            else:
                out.content += self._buffer
                self._buffer = ""
        return out

    def finish(self) -> ReasoningDelta:
        out = ReasoningDelta()
        if self._state == "reasoning":
            out.reasoning = self._buffer
        elif self._state in ("start", "content"):
            out.content = self._buffer
        self._buffer = ""
        return out


def reasoning_token_count(token_ids: list[int], think_tags: tuple[int, int], opens_reasoning: bool) -> int:
    """The output tokens within think blocks, the tags not counted (as vLLM counts them), where a prompt that
    opens its think block starts the output inside one."""
    start, end = think_tags
    depth, count = int(opens_reasoning), 0
    for token in token_ids:
        if token == start:
            depth += 1
        elif token == end:
            depth = max(depth - 1, 0)
        elif depth:
            count += 1
    return count
