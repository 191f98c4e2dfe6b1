"""The engine's per-token logprobs in OpenAI's two shapes (chat and legacy completions), and the prompt's in
vLLM's."""

from __future__ import annotations

from typing import Any

from deltaserve.outputs import Logprob


class TokenText:
    """Decodes single token ids for display, caching the answers; `bytes_of` gives a token's own bytes."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def bytes_of(self, token_id: int) -> list[int]:
        """OpenAI's `bytes`: the token's own bytes, which a token holding part of a character (an emoji's first
        bytes) has where its own decode shows U+FFFD (and its logprob's text is what it adds to the tokens before
        it: logprob_text); else its own text's UTF-8."""
        text = self(token_id)
        if "\ufffd" not in text:
            return list(text.encode("utf-8"))
        found = self._bytes.get(token_id)
        if found is None:
            found = self._bytes[token_id] = _vocabulary_bytes(self._tokenizer, token_id) or list(text.encode("utf-8"))
        return found

    def __call__(self, token_id: int, logprob: Logprob | None = None) -> str:
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes byte b as one printable character: the printable Latin-1 ones as
    themselves, the others as chr(256 + n) in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()


def _vocabulary_bytes(tokenizer: Any, token_id: int) -> list[int] | None:
    """A token's bytes from its vocabulary entry: byte-level BPE's characters (Qwen, Llama 3, SmolLM2), or a
    SentencePiece byte token <0xNN>; None where the entry is neither."""
    try:
        piece = tokenizer.convert_ids_to_tokens([token_id])[0]
    except Exception:  # a tokenizer without a vocabulary to look in
        return None
    if not isinstance(piece, str):
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return [int(piece[3:5], 16)]
    if piece and all(c in _BYTE_LEVEL for c in piece):
        return [_BYTE_LEVEL[c] for c in piece]
    return None


def token_label(token_id: int, text: str, as_ids: bool) -> str:
    """How logprobs name a token: its text, or vLLM's "token_id:ID" (which any token's bytes can be told by)."""
    return f"token_id:{token_id}" if as_ids else text


def _ranked(entry: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    """The entry's k best tokens by rank (-1: all of them)."""
    return sorted(entry.items(), key=lambda item: item[1].rank)[: None if k == -1 else k]


def _finite(value: float) -> float:
    return max(value, -9999.0)  # -inf is not JSON


def chat_logprobs(
    token_ids: list[int], entries: list[dict[int, Logprob]], top: int, token_text: TokenText, as_ids: bool = False
) -> dict[str, Any]:
    """OpenAI's chat shape: each token with its bytes (its own, whatever names it) and its top ones."""
    content = []
    for token_id, entry in zip(token_ids, entries):
        chosen = entry.get(token_id)
        text = token_text(token_id, chosen)
        content.append(
            {
                "token": token_label(token_id, text, as_ids),
                "logprob": _finite(chosen.logprob) if chosen else -9999.0,
                "bytes": token_text.bytes_of(token_id),
                "top_logprobs": [
                    {"token": token_label(tid, token_text(tid, lp), as_ids), "logprob": _finite(lp.logprob),
                     "bytes": token_text.bytes_of(tid)}
                    for tid, lp in _ranked(entry, top)
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    token_ids: list[int], entries: list[dict[int, Logprob]], top: int, token_text: TokenText, text_offset: int,
    as_ids: bool = False,
) -> dict[str, Any]:
    """The legacy shape: tokens, their logprobs, each position's top ones by name, and each token's text offset."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries):
        chosen = entry.get(token_id)
        text = token_text(token_id, chosen)
        tokens.append(token_label(token_id, text, as_ids))
        token_logprobs.append(_finite(chosen.logprob) if chosen else -9999.0)
        # the chosen token, then the top ones (vLLM's and OpenAI's legacy shape: up to top + 1 entries)
        ranked = ([(token_id, chosen)] if chosen else []) + _ranked(entry, top)
        top_logprobs.append({token_label(tid, token_text(tid, lp), as_ids): _finite(lp.logprob) for tid, lp in ranked})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def prompt_logprobs_json(entries: list[dict[int, Logprob] | None] | None,
                         token_text: TokenText) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: for each prompt token (None for the first, which nothing predicts) its own
    logprob and the top ones, by token id, each with its rank and decoded text."""
    if entries is None:
        return None
    return [None if entry is None else
            {tid: {"logprob": _finite(lp.logprob), "rank": lp.rank, "decoded_token": token_text(tid, lp)}
             for tid, lp in entry.items()}
            for entry in entries]
