"""Incremental detokenization with stop strings.

Text grows only by whole characters: a token that ends inside a multi-byte UTF-8 character adds
nothing until the character completes. A few prompt tokens serve as left context so that
tokenizers which mark word starts (a leading space) decode the first output token as they would in
the middle of the text; the context starts at a character's first byte, since a SentencePiece
decoder that meets a run of byte tokens it cannot read as UTF-8 replaces every byte of the run, the
output's own with them. `visible_text` never shows a stop string nor the part of one that may be
forming at the end.
"""

from __future__ import annotations

from deltaserve.sampling_params import SamplingParams

CONTEXT_TOKENS = 5
MAX_CHARACTER_BYTES = 4  # UTF-8's longest character: a context's ends move back at most this less one tokens
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        self.tokenizer = tokenizer
        self.skip_special = params.skip_special_tokens
        self.stop_strings = params.stop_strings
        self.include_stop = params.include_stop_str_in_output
        # as vLLM does, stop strings are looked for once the output is longer than min_tokens, in the text of the
        # tokens after those (and the few characters before, where a stop string may begin)
        self.min_tokens = params.min_tokens
        self.num_tokens = 0
        self.ids, self.read_offset = self._context(list(prompt_token_ids))
        self.prefix_offset = 0
        self.text = ""
        self.stopped_by: str | None = None

    def _context(self, prompt: list[int]) -> tuple[list[int], int]:
        """The prompt's last CONTEXT_TOKENS tokens, from up to three tokens earlier where those begin inside a
        character, and where in them its last whole character ends: a prompt that ends inside a character leaves
        the bytes of it to the output, whose text then holds the character they complete. Both ends are looked
        for together, since a run of byte tokens that does not read as UTF-8 is replaced whole: a context cut
        inside a character at one end reads as cut at the other too."""
        first = max(0, len(prompt) - CONTEXT_TOKENS)
        starts = range(first, max(-1, first - MAX_CHARACTER_BYTES), -1)
        for end in range(len(prompt), max(first, len(prompt) - MAX_CHARACTER_BYTES), -1):
            for start in starts:
                text = self._decode(prompt[start:end])
                if not text.startswith(REPLACEMENT) and not text.endswith(REPLACEMENT):
                    return prompt[start:], end - start
        return prompt[first:], len(prompt) - first  # replacement characters of the prompt's own

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def append(self, token_id: int) -> str | None:
        """Adds one token. Returns the stop string it completed, if any (the text is cut there)."""
        self.ids.append(token_id)
        self.num_tokens += 1
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return None  # an unfinished character (or nothing printable) so far
        old_length = len(self.text)
        self.text += after[len(before):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._find_stop(old_length) if self.num_tokens > self.min_tokens else None

    def _find_stop(self, old_length: int) -> str | None:
        """The stop string that ends in the text past `old_length` and starts first. Each is looked for from
        its length less one before the new text: one wholly in the old text was found then, or did not count
        then (within min_tokens)."""
        best = None
        for stop in self.stop_strings:
            at = self.text.find(stop, max(0, old_length - len(stop) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return None
        at, stop = best
        self.text = self.text[: at + len(stop)] if self.include_stop else self.text[:at]
        self.stopped_by = stop
        return stop

    def visible_text(self, finished: bool) -> str:
        """The text that is safe to show: while running, minus any tail that could begin a stop string."""
        if finished or self.stopped_by is not None or not self.stop_strings:
            return self.text
        return self.text[: len(self.text) - self._pending_stop_prefix()]

    def _pending_stop_prefix(self) -> int:
        longest = 0
        for stop in self.stop_strings:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
