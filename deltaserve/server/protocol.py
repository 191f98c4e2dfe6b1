"""OpenAI request bodies, validated with pydantic. Unknown fields are accepted and ignored; known ones
the server cannot honour (a response_format of another type, best_of other than n, a suffix) are read
so that the server can refuse them by name.

Only the shape and types are checked here; value ranges are SamplingParams' job, so one
place states them. Responses are plain dicts built by the serving modules.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

Number = StrictInt | StrictFloat  # JSON numbers only: no strings, no booleans
# OpenAI's and vLLM's reasoning efforts (the Responses API and Anthropic's output_config take some of them)
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Lenient):
    type: StrictStr
    text: StrictStr | None = None


class FunctionCallIn(_Lenient):
    name: StrictStr
    arguments: StrictStr | dict[str, Any] = "{}"


class ToolCallIn(_Lenient):
    id: StrictStr | None = None
    type: StrictStr = "function"
    function: FunctionCallIn


class ChatMessage(_Lenient):
    role: StrictStr
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: StrictStr | None = None
    reasoning: StrictStr | None = None  # an earlier turn's reasoning, under vLLM's name ...
    reasoning_content: StrictStr | None = None  # ... or DeepSeek's; the template reads reasoning_content


class FunctionDef(_Lenient):
    name: StrictStr = Field(min_length=1)  # a call names its function: an empty name names none
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Lenient):
    name: StrictStr


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Lenient):
    include_usage: StrictBool | None = False
    continuous_usage_stats: StrictBool | None = False  # vLLM's: with include_usage, usage in every chunk


class JsonSchemaFormat(_Lenient):
    """OpenAI's response_format.json_schema: the schema under "schema" (a name pydantic keeps for itself)."""

    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Lenient):
    type: StrictStr
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(BaseModel):
    """vLLM's structured_outputs: exactly one kind. A field the server does not know is refused, not dropped:
    a constraint silently left out would be worse than an error."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | StrictStr | None = Field(default=None, alias="json")
    json_object: StrictBool | None = None
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None
    disable_any_whitespace: StrictBool = False
    whitespace_pattern: StrictStr | None = None
    disable_additional_properties: StrictBool = False
    disable_fallback: StrictBool = False
    structural_tag: Any = None  # vLLM's; refused by name where given


class _SamplingFields(_Lenient):
    """Fields chat and completions share (OpenAI's, plus vLLM's extras)."""

    model: StrictStr | None = None
    n: StrictInt = 1
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    min_tokens: StrictInt = 0  # vLLM's: no end before this many tokens
    thinking_token_budget: StrictInt | None = None  # vLLM's: a think block's end is forced after this many tokens
    # vLLM's: the output ends once it loops (its fields checked by SamplingParams' RepetitionDetectionParams)
    repetition_detection: dict[str, Any] | None = None
    allowed_token_ids: list[StrictInt] | None = None  # vLLM's
    bad_words: list[StrictStr] | None = None  # vLLM's
    truncate_prompt_tokens: StrictInt | None = None  # vLLM's: keep the prompt's last k tokens (-1: the context)
    # vLLM's: "right" keeps the prompt's first truncate_prompt_tokens tokens instead (None: "left", the last)
    truncation_side: Literal["left", "right"] | None = None
    # vLLM's: the tokenizer's special tokens added to the prompt (None: yes for a completion's, no for a chat's,
    # whose template writes its own)
    add_special_tokens: StrictBool | None = None
    # vLLM's: the reply carries the prompt's token ids (prompt_token_ids) and each choice its own (token_ids)
    return_token_ids: StrictBool | None = None
    priority: StrictInt = 0  # vLLM's: lower is served first under --scheduling-policy priority (else only 0)
    prompt_logprobs: StrictInt | None = None  # vLLM's: each prompt token's logprob and the top ones
    # vLLM's: logprobs name each token "token_id:ID" (None: as the server's --return-tokens-as-token-ids)
    return_tokens_as_token_ids: StrictBool | None = None
    # vLLM's: the prompt's prefix-cache entries are shared only with requests of the same salt
    cache_salt: StrictStr | None = Field(default=None, min_length=1)
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    logit_bias: dict[StrictStr, Number] | None = None  # token ids as JSON object keys
    ignore_eos: StrictBool = False
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True  # vLLM's; either gives its text (SamplingParams)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    structured_outputs: StructuredOutputsField | None = None  # vLLM's
    use_beam_search: StrictBool = False  # vLLM's: the n choices are the n best beams (server/beam_search.py)
    length_penalty: Number = 1.0  # vLLM's: a beam's score is its summed logprobs over its length to this power

    # OpenAI's spec has these nullable (its SDK sends null for a None given), as vLLM takes them: null is the default
    # (completions' max_tokens too: 16, not the rest of the context)
    @field_validator("n", "stream", "logprobs", "echo", "max_tokens", mode="before", check_fields=False)
    @classmethod
    def _null_is_the_default(cls, value: Any, info) -> Any:
        return cls.model_fields[info.field_name].default if value is None else value


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: StrictStr | None = None  # vLLM's: this request's own template (--trust-request-chat-template)
    reasoning_effort: ReasoningEffort | None = None  # to the template (ServerContext.template_kwargs)
    documents: list[dict[str, StrictStr]] | None = None  # vLLM's: to the template, for retrieval-augmented ones
    response_format: ResponseFormat | None = None
    # vLLM's: open a new assistant turn after the messages (the default), or go on writing the last one
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    # vLLM's: the reply starts with the last message's text, where that message is of the reply's role
    echo: StrictBool = False
    include_reasoning: StrictBool = True  # vLLM's: False leaves the reasoning out of the reply


class CompletionRequest(_SamplingFields):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    echo: StrictBool = False
    best_of: StrictInt | None = None
    logprobs: StrictInt | None = None
    suffix: StrictStr | None = None
    response_format: ResponseFormat | None = None  # vLLM's, for completions too


class TokenizeRequest(_Lenient):
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    # vLLM's: special tokens added to a prompt (None: yes), or on top of what a chat's template writes (None: no)
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False  # vLLM's: the last (assistant) message left open, as in chat
    return_token_strs: StrictBool | None = False  # vLLM's: each token's string too
    tools: list[ToolDef] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: StrictStr | None = None  # vLLM's: as a chat request's own (--trust-request-chat-template)


class DetokenizeRequest(_Lenient):
    model: StrictStr | None = None
    tokens: list[StrictInt]


class GenerateRequest(_Lenient):
    """vLLM's tokens in, tokens out (POST /inference/v1/generate; what the render routes return)."""

    request_id: StrictStr | None = None
    token_ids: list[StrictInt] = Field(min_length=1)
    features: dict[str, Any] | None = None  # vLLM's multimodal placeholders: text only here
    sampling_params: dict[str, Any]  # vLLM's SamplingParams, field by field (required, as vLLM's)
    model: StrictStr | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: StrictStr | None = Field(default=None, min_length=1)
    priority: StrictInt = 0
    kv_transfer_params: dict[str, Any] | None = None  # vLLM's disaggregated prefill: none here
