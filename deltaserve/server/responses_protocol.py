"""OpenAI Responses API request bodies (POST /v1/responses), validated with pydantic as protocol.py's are:
shape and types here, values where they are used. The fields the server cannot honour (a stored earlier
response, tools that run on OpenAI's side, input that is not text) are read so that they are refused by name."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from deltaserve.server.protocol import Number, _Lenient


class InputContent(_Lenient):
    """A content part of an input message: input_text (a user's), output_text (an earlier reply's), or a kind
    the server refuses (input_image, input_file)."""

    type: StrictStr
    text: StrictStr | None = None


class InputItem(_Lenient):
    """One input item: a message (type "message", or none with a role), an earlier function call, its
    output, or an earlier reasoning item."""

    type: StrictStr | None = None
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: StrictStr | list[InputContent] | None = None
    call_id: StrictStr | None = None  # function_call, function_call_output
    name: StrictStr | None = None  # function_call
    arguments: StrictStr | None = None  # function_call
    output: StrictStr | list[InputContent] | None = None  # function_call_output
    summary: list[InputContent] | None = None  # reasoning: its summary_text parts
    status: StrictStr | None = None  # an earlier item's: "incomplete" (or "in_progress") where it was cut short


class FunctionTool(_Lenient):
    type: StrictStr  # "function"; any other (web_search, file_search, ...) runs on OpenAI's side: refused
    name: StrictStr | None = None
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class NamedFunctionChoice(_Lenient):
    type: StrictStr
    name: StrictStr | None = None


class TextFormat(_Lenient):
    """text.format: "text", "json_object" or "json_schema" (its schema under "schema", flat, not nested as in
    chat's response_format)."""

    type: StrictStr
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(_Lenient):
    format: TextFormat | None = None


# what OpenAI's include may name; none but the output text's logprobs is of anything this server makes (it runs no
# tools of its own, takes no images and encrypts no reasoning), so the others add nothing
Includable = Literal["file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
                     "message.input_image.image_url", "computer_call_output.output.image_url",
                     "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs"]


class ReasoningConfig(_Lenient):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None  # OpenAI's
    summary: StrictStr | None = None


class ResponsesRequest(_Lenient):
    model: StrictStr | None = None
    input: StrictStr | list[InputItem]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    max_tool_calls: StrictInt | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: variables for the chat template
    stream: StrictBool | None = False  # null: not streamed
    store: StrictBool | None = None
    background: StrictBool | None = None
    previous_response_id: StrictStr | None = None
    conversation: StrictStr | dict[str, Any] | None = None
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = None
    include: list[Includable] | None = None  # "message.output_text.logprobs" asks for the output text's logprobs
    top_logprobs: StrictInt | None = None
    truncation: Literal["auto", "disabled"] | None = None
    priority: StrictInt = 0  # vLLM's, as chat's: lower is served first under --scheduling-policy priority
