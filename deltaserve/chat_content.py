"""The text of a chat message's content: a string as it is, a list of parts as their texts (OpenAI's text parts, a
refusal part's refusal, the Responses API's input and output text), None as none. As text the parts' texts are
joined by newlines (vLLM's joining, where a template reads text); for the template they stay parts
(chat_content_format gives them in the form the template reads). The offline LLM.chat and the server's routes read
content the same way; each names a failure in its own terms."""

from __future__ import annotations

from typing import Any


class ContentPartError(ValueError):
    """A part whose text cannot be read: of a kind no route reads (`unsupported`: an image), or a text part
    without a string."""

    def __init__(self, message: str, unsupported: bool):
        super().__init__(message)
        self.unsupported = unsupported


def content_texts(content: Any, text_kinds: tuple[str, ...] = ("text",)) -> list[str]:
    """The texts of a list of parts of the types `text_kinds` names (dicts, or objects with attributes), read from
    their `text`, or their `refusal` for a refusal part; any other part raises ContentPartError."""
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        field = "refusal" if kind == "refusal" and "refusal" in text_kinds else "text"  # OpenAI's refusal part
        text = part.get(field) if isinstance(part, dict) else getattr(part, field, None)
        if kind not in text_kinds:
            raise ContentPartError(f"content part of type {kind!r} is not supported: this model reads text parts "
                                   "only", unsupported=True)
        if not isinstance(text, str):
            raise ContentPartError(f"a content part of type {kind!r} needs its {field} as a string", unsupported=False)
        texts.append(text)
    return texts


def content_text(content: Any, text_kinds: tuple[str, ...] = ("text",)) -> str:
    """The text of `content`: a list of parts' texts joined by newlines, None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(content_texts(content, text_kinds))


def template_content(content: Any, text_kinds: tuple[str, ...] = ("text",)) -> str | list[dict] | None:
    """`content` for the template: a string or None as it is, a list of parts as text parts
    ({"type": "text", "text": ...}) of their texts."""
    if content is None or isinstance(content, str):
        return content
    return [{"type": "text", "text": text} for text in content_texts(content, text_kinds)]
