"""Chat messages and tools -> the prompt the model sees, through the checkpoint's template."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import jinja2

from deltaserve.chat_content import ContentPartError, content_text, template_content
from deltaserve.chat_content_format import messages_for_template, resolve_content_format
from deltaserve.server.errors import bad_request
from deltaserve.server.protocol import ChatMessage, ToolDef
from deltaserve.server.reasoning import prompt_opens_reasoning
from deltaserve.tokenizer import RENDERING_ARGUMENTS

logger = logging.getLogger(__name__)


@dataclass
class ChatPrompt:
    text: str
    token_ids: list[int]
    capture_points: list[int] | None
    opens_reasoning: bool


def message_text(content: Any, param: str, text_kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's content as text (chat_content.content_text); a part it cannot read is a 400 naming `param`."""
    return _read_content(content_text, content, param, text_kinds)


def message_content(content: Any, param: str, text_kinds: tuple[str, ...] = ("text",)) -> str | list[dict] | None:
    """A message's content for the template (chat_content.template_content), refused as message_text's."""
    return _read_content(template_content, content, param, text_kinds)


def _read_content(read, content: Any, param: str, text_kinds: tuple[str, ...]):
    try:
        return read(content, text_kinds)
    except ContentPartError as exc:
        raise bad_request(str(exc), param, "unsupported_value" if exc.unsupported else "invalid_value") from None


def _arguments_for_template(arguments: Any) -> Any:
    """Templates iterate arguments as a mapping (Qwen3.5) or dump them (Qwen3): as vLLM's, JSON text is given as
    what it holds, and none (null, "") as {}; text that is no JSON (a call cut short) stays as written."""
    if not arguments:
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return {} if parsed is None else parsed
    return arguments


def _reasoning(msg: ChatMessage) -> str | None:
    """An assistant message's reasoning under either name a client may send it by (a reply gives both;
    `reasoning` where they differ, as vLLM's); other roles' is dropped, as vLLM drops it."""
    if msg.role != "assistant":
        return None
    return msg.reasoning if msg.reasoning is not None else msg.reasoning_content


def check_roles(messages: list[ChatMessage]) -> None:
    """Each message names a role. As vLLM's, any name is taken (Llama 3.1's template reads "ipython"): the
    template decides what it renders, and a role it refuses is its 400."""
    for i, msg in enumerate(messages):
        if not msg.role:
            raise bad_request(f"Invalid value for 'messages.{i}.role': a message needs a role",
                              f"messages.{i}.role", "invalid_value")


def openai_messages_for_template(messages: list[ChatMessage]) -> list[dict]:
    out = []
    for i, msg in enumerate(messages):
        entry: dict[str, Any] = {
            "role": msg.role,  # a developer's is a system's where the template knows no developer (render_chat)
            "content": message_content(msg.content, f"messages.{i}.content", ("text", "refusal")),
        }
        if msg.name is not None:
            entry["name"] = msg.name
        if msg.tool_call_id is not None:
            entry["tool_call_id"] = msg.tool_call_id
        reasoning = _reasoning(msg)
        if reasoning is not None:  # under both names, as vLLM hands it
            entry["reasoning"] = entry["reasoning_content"] = reasoning
        if msg.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _arguments_for_template(call.function.arguments)},
                }
                for call in msg.tool_calls
            ]
        out.append(entry)
    return out


def openai_tools_for_template(tools: list[ToolDef] | None) -> list[dict] | None:
    """Each tool as vLLM gives it: its function's every field, null where not given (but strict)."""
    if not tools:
        return None
    return [{"type": "function", "function": _function_for_template(tool.function.model_dump())} for tool in tools]


def _function_for_template(function: dict) -> dict:
    return {k: v for k, v in function.items() if not (k in ("strict", "defer_loading") and v is None)}


def developer_as_system(messages: list[dict], template: str | None) -> list[dict]:
    """As vLLM's: where a template knows no "developer" role, a developer's message is a system's, and the
    system messages are then one, first, their texts joined by blank lines (templates that take a system
    message only first)."""
    if not any(m.get("role") == "developer" for m in messages):
        return messages
    if template is not None and ('"developer"' in template or "'developer'" in template):
        return messages
    messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    systems = [i for i, m in enumerate(messages) if m["role"] == "system"]
    if systems == [0]:
        return messages
    texts = [text for i in systems if (text := _system_text(messages[i].get("content")))]
    return [{"role": "system", "content": "\n\n".join(texts)}, *(m for m in messages if m["role"] != "system")]


def _system_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p["text"] if isinstance(p, dict) else p for p in content
                         if isinstance(p, str) or (isinstance(p, dict) and "text" in p))
    return content or ""


def tool_schemas(tools: list[dict] | None) -> dict[str, dict] | None:
    """name -> JSON schema of the parameters, for typing parsed arguments; None: no tools."""
    if not tools:
        return None
    return {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}


def check_tool_names(names: list[str], param: str) -> None:
    """A call names its tool, so two tools of one name would leave unsaid which one it called: a 400 naming the
    second (`param` is its field, with {i} for its index)."""
    seen = set()
    for i, name in enumerate(names):
        where = param.format(i=i)
        if name in seen:
            raise bad_request(f"{where}: {name!r} names an earlier tool too; each tool's name must be unique", where,
                              "invalid_value")
        seen.add(name)


def check_rendering_fields(ctx: Any, continue_final: bool, add_generation_prompt: bool,
                           chat_template: str | None) -> None:
    """A chat request's rendering fields, as chat and /tokenize take them: continue_final_message goes on writing
    the last message, so it cannot open a new turn; a request's own template only where the server trusts it."""
    if continue_final and add_generation_prompt:
        raise bad_request("continue_final_message goes on writing the last message, so it needs "
                          "add_generation_prompt set to false", "continue_final_message", "invalid_value")
    if chat_template is not None and not ctx.trust_request_chat_template:
        raise bad_request("chat_template: a request's own template runs on the server, so it is refused unless "
                          "the server starts with --trust-request-chat-template", "chat_template",
                          "unsupported_value")


def render_chat(
    tokenizer: Any,
    messages: list[dict],
    tools: list[dict] | None,
    template_kwargs: dict | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final: bool = False,
    chat_template: str | None = None,
    capture_points: bool = True,
) -> ChatPrompt:
    """The prompt of a chat: a new assistant turn opened after the messages (add_generation_prompt), or with
    continue_final the last (assistant) message left open, for the model to go on writing it (a prefill).
    chat_template: the request's own template in place of the server's (which the caller has allowed).
    capture_points: False where the prompt is only counted (/tokenize): finding them renders each turn again.
    Each message's content goes to the template in the form it reads (chat_content_format)."""
    kwargs = _template_options(template_kwargs)
    template = chat_template or template_source(tokenizer)
    content_format = resolve_content_format(getattr(tokenizer, "chat_content_format", "auto"), template)
    messages = messages_for_template(developer_as_system(messages, template), content_format)
    if chat_template is not None:
        try:
            jinja2.Environment().parse(chat_template)
        except jinja2.TemplateSyntaxError as exc:
            raise bad_request(f"chat_template: not a Jinja template ({exc})", "chat_template", "invalid_value") from None
    if continue_final:  # the last message of any role, as vLLM's (an assistant's: a prefill)
        if not messages:
            raise bad_request("continuing the final message needs a final message", "messages", "invalid_value")
        # the capture points then come from each earlier turn rendered the same way (message_offsets)
        kwargs["continue_final_message"] = True
        add_generation_prompt = False
    text = render_chat_text(tokenizer, messages, tools, kwargs, add_generation_prompt, chat_template)
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    points = None
    try:
        if capture_points:
            points = tokenizer.message_offsets(messages, tools=tools, full=token_ids, **kwargs)
    except Exception:  # prefix-cache capture points are an optimisation only
        logger.debug("message_offsets failed", exc_info=True)
    return ChatPrompt(text=text, token_ids=token_ids, capture_points=points, opens_reasoning=prompt_opens_reasoning(text))


def _template_options(template_kwargs: dict | None) -> dict:
    """A request's chat_template_kwargs, less what the server sets itself. A template of the client's own is
    refused: it would run in the server (a loop of loops renders for as long as the client likes)."""
    kwargs = dict(template_kwargs or {})
    if "chat_template" in kwargs:
        raise bad_request("chat_template_kwargs may not carry a chat_template: the server renders with its own "
                          "(--chat-template)", "chat_template_kwargs.chat_template", "unsupported_value")
    named = next((name for name in RENDERING_ARGUMENTS if name in kwargs), None)
    if named is not None:
        raise bad_request(f"chat_template_kwargs may not carry {named}: the server sets how the chat is rendered",
                          f"chat_template_kwargs.{named}", "unsupported_value")
    kwargs.pop("tools", None)
    kwargs.pop("add_generation_prompt", None)
    if not kwargs.get("continue_final_message"):
        kwargs.pop("continue_final_message", None)
    return kwargs


def render_chat_text(tokenizer: Any, messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None,
                     add_generation_prompt: bool = True, chat_template: str | None = None) -> str:
    """The conversation as the template writes it (the server's, or `chat_template`); a template's refusal is
    the request's 400."""
    options = _template_options(template_kwargs)  # its refusals name their field, not the messages
    if chat_template is not None:
        options["chat_template"] = chat_template
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                             **options)
    except Exception as exc:  # the template refused these messages (roles, order, fields)
        raise bad_request(f"the chat template could not render these messages: {exc}", "messages") from exc


def template_source(tokenizer: Any) -> str | None:
    hf = getattr(tokenizer, "hf", None)
    template = getattr(tokenizer, "chat_template", None) or getattr(hf, "chat_template", None)
    return template if isinstance(template, str) else None


def template_has_reasoning(tokenizer: Any) -> bool:
    """Does this model think in `<think>` blocks? The template says so, or the vocabulary does."""
    template = template_source(tokenizer)
    if template is not None and "</think>" in template:
        return True
    try:
        return len(tokenizer.encode("</think>", add_special_tokens=False)) == 1
    except Exception:
        return False
