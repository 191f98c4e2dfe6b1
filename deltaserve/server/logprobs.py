"""The engine's per-token logprobs in OpenAI's two shapes (chat and legacy completions), and the prompt's in
vLLM's."""

from __future__ import annotations

from typing import Any

from deltaserve.outputs import Logprob


class TokenText:
    """Decodes single token ids for display, caching the answers."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int, logprob: Logprob | None = None) -> str:
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text


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
    """OpenAI's chat shape: each token with its bytes (its text's, whatever names it) and its top ones."""
    content = []
    for token_id, entry in zip(token_ids, entries):
        chosen = entry.get(token_id)
        text = token_text(token_id, chosen)
        content.append(
            {
                "token": token_label(token_id, text, as_ids),
                "logprob": _finite(chosen.logprob) if chosen else -9999.0,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {"token": token_label(tid, t := token_text(tid, lp), as_ids), "logprob": _finite(lp.logprob),
                     "bytes": list(t.encode("utf-8"))}
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
