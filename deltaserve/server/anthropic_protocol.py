"""Anthropic Messages API request bodies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from deltaserve.server.protocol import Number


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentBlock(_Lenient):
    type: StrictStr
    text: StrictStr | None = None
    # tool_use
    id: StrictStr | None = None
    name: StrictStr | None = None
    input: dict[str, Any] | None = None
    # tool_result
    tool_use_id: StrictStr | None = None
    content: StrictStr | list[dict[str, Any]] | None = None
    is_error: StrictBool | None = None
    # thinking
    thinking: StrictStr | None = None


class AnthropicMessage(_Lenient):
    role: Literal["user", "assistant"]
    content: StrictStr | list[ContentBlock]


class AnthropicTool(_Lenient):
    type: StrictStr | None = None  # "custom", or one of Anthropic's server tools (web search, code execution...)
    name: StrictStr = Field(min_length=1)
    description: StrictStr | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class AnthropicToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None
    disable_parallel_tool_use: StrictBool | None = None


class AnthropicThinking(_Lenient):
    """Extended thinking: "enabled" with a budget of thinking tokens, "disabled", or "adaptive" (the model's
    choice)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: StrictInt | None = None


class AnthropicOutputFormat(_Lenient):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class AnthropicOutputConfig(_Lenient):
    """The output's form (a JSON schema it is held to) and the effort of its reasoning (to the chat template as
    reasoning_effort, as vLLM hands it)."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: AnthropicOutputFormat | None = None


class MessagesRequest(_Lenient):
    model: StrictStr
    max_tokens: StrictInt
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: StrictStr | list[ContentBlock] | None = None
    stop_sequences: list[StrictStr] | None = None
    stream: StrictBool | None = False  # null: not streamed
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    metadata: dict[str, Any] | None = None
    thinking: AnthropicThinking | None = None
    output_config: AnthropicOutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: variables for the chat template


class CountTokensRequest(_Lenient):
    model: StrictStr
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: StrictStr | list[ContentBlock] | None = None
    thinking: AnthropicThinking | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_config: AnthropicOutputConfig | None = None  # its effort renders the prompt as the request's does
    chat_template_kwargs: dict[str, Any] | None = None
