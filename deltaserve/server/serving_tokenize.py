"""POST /tokenize and /detokenize, and GET /tokenizer_info where the server enables it (vLLM's shapes)."""

from __future__ import annotations


from fastapi import Request

from deltaserve.server.chat_prompt import (check_rendering_fields, check_roles, openai_messages_for_template,
                                          openai_tools_for_template, render_chat)
from deltaserve.server.context import ServerContext, read_json_object
from deltaserve.server.errors import bad_request
from deltaserve.server.protocol import DetokenizeRequest, TokenizeRequest
from deltaserve.server.off_loop import off_loop


async def tokenize(ctx: ServerContext, request: Request) -> dict:
    req = TokenizeRequest.model_validate(await read_json_object(request))
    ctx.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of 'prompt' or 'messages'", "prompt")
    if req.messages is not None:
        check_roles(req.messages)
        check_rendering_fields(ctx, req.continue_final_message, req.add_generation_prompt, req.chat_template)
    tokens = await off_loop(ctx.engine, _tokens, ctx, req)  # off the event loop, as chat's rendering is
    token_strs = ctx.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None  # null, as vLLM's
    return {"count": len(tokens), "max_model_len": ctx.max_model_len, "tokens": tokens, "token_strs": token_strs}


def _tokens(ctx: ServerContext, req: TokenizeRequest) -> list[int]:
    if req.messages is not None:
        prompt = render_chat(ctx.tokenizer, openai_messages_for_template(req.messages),
                             openai_tools_for_template(req.tools), ctx.template_kwargs(req.chat_template_kwargs),
                             add_generation_prompt=req.add_generation_prompt, continue_final=req.continue_final_message,
                             chat_template=req.chat_template, capture_points=False)
        if req.add_special_tokens:  # on top of what the template writes, as vLLM's option asks
            return ctx.tokenizer.encode(prompt.text, add_special_tokens=True)
        return prompt.token_ids
    return ctx.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens is not False)


async def detokenize(ctx: ServerContext, request: Request) -> dict:
    req = DetokenizeRequest.model_validate(await read_json_object(request))
    ctx.check_model(req.model)
    vocab = getattr(ctx.tokenizer, "vocab_size", None)
    model_config = getattr(ctx.engine.engine, "model_config", None)
    vocab = getattr(model_config, "vocab_size", None) or vocab
    for i, token in enumerate(req.tokens):
        if token < 0 or (vocab is not None and token >= vocab):
            raise bad_request(f"token id {token} at position {i} is outside the vocabulary (size {vocab})", "tokens")
    return {"prompt": ctx.tokenizer.decode(req.tokens, skip_special_tokens=False)}


# the paths of the vocabulary files on the server's disk, which vLLM leaves out
_LOCAL_FILES = ("vocab_file", "merges_file")


def tokenizer_info(ctx: ServerContext) -> dict:
    """vLLM's GET /tokenizer_info: the tokenizer's own settings (transformers' init_kwargs, tokenizer_config.json's
    fields), its class, and the chat template the server renders with (--chat-template's where given)."""
    hf = ctx.tokenizer.hf
    settings = getattr(hf, "init_kwargs", None) or {}
    info = {name: _as_json(value) for name, value in settings.items() if name not in _LOCAL_FILES}
    info["tokenizer_class"] = type(hf).__name__
    if hf.chat_template:
        info["chat_template"] = _as_json(hf.chat_template)
    return info


def _as_json(value):
    """A setting as JSON carries it: an added token as its text (as vLLM's), containers item by item, and
    anything else JSON has no form for as its text (encoding it would fail the response)."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(key): _as_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
