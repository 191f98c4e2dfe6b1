"""How a chat template reads a message's content, decided as vLLM decides it ("auto"), and a conversation's
messages given to it that way.

"openai": the template loops over a message's content, so it is given every message's content as a list of
{"type": "text", "text": ...} parts (a string as one part, none as no part). "string": it is given text, the
texts of a list of parts joined by newlines. A tool message's content is text either way (templates print a tool
result whole). The template is read, not run: a loop whose iterable is a message's `content` (the messages
reached through `messages`, through variables set from it and through loops over them), or a variable named
`content` (a macro's argument, as Qwen3.5's template has), makes it "openai"."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import jinja2
import jinja2.ext
from jinja2 import nodes

ContentFormat = Literal["string", "openai"]
CONTENT_FORMATS = ("auto", "string", "openai")


class _GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %} (it marks the assistant's tokens): parsed as its body,
    so that a template using it can be read."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _Unreadable(Exception):
    """A template read where a loop or a setting binds something other than one name: vLLM's reading gives up on
    it, and takes "string"."""


def resolve_content_format(given: str, template: str | None) -> ContentFormat:
    """`given` ("string", "openai" or "auto": read from the template)."""
    if given not in CONTENT_FORMATS:
        raise ValueError(f"chat template content format {given!r}: give one of {', '.join(CONTENT_FORMATS)}")
    return detect_content_format(template) if given == "auto" else given


@lru_cache(maxsize=32)
def detect_content_format(template: str | None) -> ContentFormat:
    if template is None:
        return "string"
    try:
        tree = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, _GenerationTag]).parse(template)
        return "openai" if _loops_over_content(tree) else "string"
    except (jinja2.TemplateError, _Unreadable):
        return "string"


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """Whether `node` is the variable `name` (or its `key`, as name.key or name["key"]), through any filters,
    tests and slices."""
    if isinstance(node, (nodes.Filter, nodes.Test)):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    if key is None:
        return _reads_name(node, name)
    if isinstance(node, nodes.Getattr):
        return _reads_name(node.node, name) and node.attr == key
    if isinstance(node, nodes.Getitem):
        return _reads_name(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    return False


def _reads_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _bound_name(target: nodes.Node) -> str:
    if not isinstance(target, nodes.Name):
        raise _Unreadable()
    return target.name


def _names_of_messages(tree: nodes.Template) -> list[str]:
    """`messages`, and each variable set from it (or from one of these), however many steps away."""
    names, queue = ["messages"], ["messages"]
    while queue:
        source = queue.pop(0)
        for assign in tree.find_all(nodes.Assign):
            if _reads(assign.node, source):
                name = _bound_name(assign.target)
                names.append(name)
                if name != source:
                    queue.append(name)
    return names


def _message_names(tree: nodes.Template) -> list[str]:
    """The variables that loops over the messages bind."""
    sources = _names_of_messages(tree)
    return [_bound_name(loop.target) for loop in tree.find_all(nodes.For)
            if any(_reads(loop.iter, source) for source in sources)]


def _loops_over_content(tree: nodes.Template) -> bool:
    messages = _message_names(tree)
    for loop in tree.find_all(nodes.For):
        if any(_reads(loop.iter, message, "content") for message in messages) or _reads_name(loop.iter, "content"):
            _bound_name(loop.target)
            return True
    return False


def content_for_template(content, role: str, content_format: ContentFormat):
    """One message's content as a template of `content_format` reads it (content as chat_content.template_content
    gives it: a string, a list of text parts, or None)."""
    parts = ([] if content is None else [{"type": "text", "text": content}] if isinstance(content, str)
             else list(content))
    if content_format == "string" or role == "tool":
        return content if isinstance(content, str) else "\n".join(part["text"] for part in parts)
    return parts


def messages_for_template(messages: list[dict], content_format: ContentFormat) -> list[dict]:
    return [{**message, "content": content_for_template(message.get("content"), message.get("role"), content_format)}
            if "content" in message else message for message in messages]
