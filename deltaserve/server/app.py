"""build_app: the FastAPI application over one AsyncEngine."""

from __future__ import annotations

import asyncio
import hmac
import importlib.metadata
import logging
import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from deltaserve.engine.async_engine import AsyncEngine
from deltaserve.server.context import ClientDisconnected, ServerContext, read_json_object
from deltaserve.server.errors import APIError, bad_request, from_exception
from deltaserve.server.http_metrics import HttpMetrics, HttpMetricsMiddleware
from deltaserve.server.metrics import CONTENT_TYPE
from deltaserve.server.serving_chat import ChatCompletions
from deltaserve.server.serving_chat_batch import batch_chat
from deltaserve.server.serving_completions import Completions
from deltaserve.server.serving_messages import Messages
from deltaserve.server.serving_render import render_chat, render_completion
from deltaserve.server.serving_responses import Responses
from deltaserve.server.serving_tokenize import detokenize, tokenize, tokenizer_info
from deltaserve.server.serving_tokens import GenerateTokens
from deltaserve.server.stats_log import StatsLog

logger = logging.getLogger(__name__)

_OPEN_PATHS = ("/health", "/metrics", "/ping", "/version", "/load")


def _is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def route_path(scope) -> str:
    """A request's path as the routes see it: without the --root-path prefix that uvicorn puts in front."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def error_response(scope, error: APIError) -> JSONResponse:
    """The error in the shape of the route's API (Anthropic's under /v1/messages, else OpenAI's)."""
    body = error.anthropic_body() if _is_anthropic(route_path(scope)) else error.openai_body()
    return JSONResponse(body, status_code=error.status, headers=error.headers)


class APIKeyMiddleware:
    """Requires `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic's), KEY one of the
    server's keys."""

    def __init__(self, app, api_keys: list[str]):
        self.app = app
        self.api_keys = [key.encode() for key in api_keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or route_path(scope) in _OPEN_PATHS or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"")
        keys = [headers.get(b"x-api-key", b""), auth[7:].strip() if auth[:7].lower() == b"bearer " else b""]
        # either header may carry the key (a client may send both, one of them for another service); a header
        # left out is no key, whatever the keys are
        if any([hmac.compare_digest(given, key) for given in keys if given for key in self.api_keys]):
            return await self.app(scope, receive, send)
        error = APIError(401, "Invalid or missing API key", type="authentication_error", code="invalid_api_key")
        await error_response(scope, error)(scope, receive, send)


def _answering_errors(handler):
    """Route wrapper: every failure becomes its error response here, not in the 500 middleware."""

    async def route(request: Request):
        try:
            return await handler(request)
        except (ClientDisconnected, ClientDisconnect):  # gone before the answer (or before sending all its body)
            return Response(status_code=499)
        except Exception as exc:
            error = from_exception(exc)
            if error.status >= 500 and error.status != 503:
                logger.exception("request failed", exc_info=exc)
            return error_response(request.scope, error)

    route.__name__ = getattr(handler, "__name__", "route")
    return route


def server_dev_mode() -> bool:
    """vLLM's VLLM_SERVER_DEV_MODE (or DELTASERVE_SERVER_DEV_MODE): development routes such as /reset_prefix_cache."""
    return any(os.environ.get(name, "0").strip().lower() in ("1", "true")
               for name in ("DELTASERVE_SERVER_DEV_MODE", "VLLM_SERVER_DEV_MODE"))


def _package_version() -> str:
    try:
        return importlib.metadata.version("deltaserve")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_app(engine: AsyncEngine, served_model_names: list[str] | None = None, *,
              api_key: str | list[str] | None = None, reasoning: bool | None = None,
              force_include_usage: bool = False, return_tokens_as_token_ids: bool = False,
              default_chat_template_kwargs: dict | None = None, trust_request_chat_template: bool = False,
              response_role: str = "assistant", log_stats_interval: float | None = None,
              tool_call_parser: str | None = None, exclude_tools_when_tool_choice_none: bool = False,
              tokenizer_info_endpoint: bool = False) -> FastAPI:
    """The app; it starts the engine thread on startup and stops it on shutdown. api_key: the key, or keys, a
    request must carry (None: none). force_include_usage: every stream ends with its usage, as if its
    stream_options asked (vLLM's --enable-force-include-usage). return_tokens_as_token_ids: logprobs name each
    token "token_id:ID" where a request does not say. default_chat_template_kwargs: template variables under
    each chat's own. trust_request_chat_template: a chat request may bring its own template. response_role: the
    role of a chat reply that opens a new turn (vLLM's --response-role). log_stats_interval: seconds between two
    lines of vLLM's periodic stats in the log (stats_log.py; None: none). tool_call_parser: vLLM's name of the
    format tool calls come in (None: the one the chat template asks for). exclude_tools_when_tool_choice_none:
    vLLM's flag, a chat whose tool_choice is "none" rendered without its tools (else the template shows them).
    tokenizer_info_endpoint: serve vLLM's GET /tokenizer_info (its --enable-tokenizer-info-endpoint; off, as
    there, since it shows the chat template and the tokenizer's settings)."""
    api_keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
    ctx = ServerContext(engine, served_model_names or [engine.model_name], api_keys=api_keys, reasoning=reasoning,
                        force_include_usage=force_include_usage,
                        return_tokens_as_token_ids=return_tokens_as_token_ids,
                        default_chat_template_kwargs=dict(default_chat_template_kwargs or {}),
                        trust_request_chat_template=trust_request_chat_template, response_role=response_role,
                        tool_call_parser=tool_call_parser,
                        exclude_tools_when_tool_choice_none=exclude_tools_when_tool_choice_none)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        stats_lines = None
        if log_stats_interval is not None:
            stats_lines = asyncio.create_task(StatsLog(lambda: engine.stats).run(log_stats_interval))
        try:
            yield
        finally:
            if stats_lines is not None:
                stats_lines.cancel()
            engine.stop()

    app = FastAPI(title="deltaserve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ctx = ctx
    if api_keys:
        app.add_middleware(APIKeyMiddleware, api_keys=api_keys)
    app.add_middleware(HttpMetricsMiddleware, metrics=HttpMetrics(ctx.metrics.registry),  # 401s counted too
                       router=app.router)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(request.scope, exc)

    @app.exception_handler(ValidationError)
    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: Exception):
        if isinstance(exc, RequestValidationError):
            first = exc.errors()[0] if exc.errors() else {}
            loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
            error = APIError(400, f"Invalid request: {first.get('msg', 'invalid')}", param=loc or None)
        else:
            error = from_exception(exc)
        return error_response(request.scope, error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(request.scope, APIError(exc.status_code, str(exc.detail), type=kind,
                                                         headers=exc.headers))  # a 405's Allow

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, exc: ClientDisconnected):
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception):
        error = from_exception(exc)
        if error.status >= 500 and error.status != 503:
            logger.exception("request failed", exc_info=exc)
        return error_response(request.scope, error)

    chat = ChatCompletions(ctx)
    completions = Completions(ctx)
    messages = Messages(ctx)
    responses = Responses(chat)
    generate_tokens = GenerateTokens(ctx)

    @app.get("/health")
    async def health():
        if not engine.is_alive:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok"}

    app.add_api_route("/ping", health, methods=["GET", "POST"])  # the health check under vLLM's other name

    @app.get("/version")
    async def version():
        return {"version": _package_version()}

    @app.get("/metrics")
    async def metrics():
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/load")
    async def load():
        """vLLM's server load: the requests the engine holds, running or waiting."""
        stats = engine.stats
        return {"server_load": (stats.num_running + stats.num_waiting) if stats is not None else 0}

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": ctx.created, "owned_by": "deltaserve",
                "root": engine.model_name, "max_model_len": ctx.max_model_len}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(name) for name in ctx.served_model_names]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        if model_id not in ctx.served_model_names:  # none, too
            raise ctx.not_served(model_id)
        return model_card(model_id)

    async def _tokenize(request: Request):
        return await tokenize(ctx, request)

    async def _detokenize(request: Request):
        return await detokenize(ctx, request)

    async def _batch_chat(request: Request):
        return await batch_chat(chat, request)

    async def _render_chat(request: Request):
        return await render_chat(chat, request)

    async def _render_completion(request: Request):
        return await render_completion(completions, request)

    async def _tokenizer_info(request: Request):
        return tokenizer_info(ctx)

    async def _invocations(request: Request):
        """SageMaker's route, as vLLM's: a body of messages is a chat completion, a body with a prompt a
        completion (the body is read once: Starlette keeps it for the route that reads it again)."""
        body = await read_json_object(request)
        if "messages" in body:
            return await chat(request)
        if "prompt" in body:
            return await completions(request)
        raise bad_request("/invocations takes a chat completion's body (messages) or a completion's (prompt)",
                          code="invalid_request")

    async def _reset_prefix_cache(request: Request):
        """vLLM's development route: the prefix cache forgets what no running request holds (a benchmark's cold
        start). Resetting running requests' blocks, or an external cache, is not something this engine does."""
        for flag in ("reset_running_requests", "reset_external"):
            if request.query_params.get(flag, "false").lower() not in ("false", "0"):
                raise bad_request(f"{flag}: only the prefix cache that no running request holds is reset here",
                                  flag, "unsupported_value")
        await engine.reset_prefix_cache()
        return Response(status_code=200)

    async def _start_profile(request: Request):
        logger.info("starting the profiler")
        await engine.start_profile()
        return Response(status_code=200)

    async def _stop_profile(request: Request):
        logger.info("stopping the profiler")
        await engine.stop_profile()
        return Response(status_code=200)

    routes = {
        "/v1/chat/completions": chat.__call__,
        "/v1/completions": completions.__call__,
        "/v1/responses": responses.__call__,
        "/v1/messages": messages.__call__,
        "/v1/messages/count_tokens": messages.count_tokens,
        "/tokenize": _tokenize,
        "/detokenize": _detokenize,
        "/invocations": _invocations,
        "/inference/v1/generate": generate_tokens.__call__,
        "/v1/chat/completions/render": _render_chat,
        "/v1/chat/completions/batch": _batch_chat,
        "/v1/completions/render": _render_completion,
    }
    if server_dev_mode():
        routes["/reset_prefix_cache"] = _reset_prefix_cache
    if getattr(getattr(engine, "engine", None), "profiler", None) is not None:  # vLLM's, where one is configured
        routes["/start_profile"] = _start_profile
        routes["/stop_profile"] = _stop_profile
    for path, handler in routes.items():
        app.add_api_route(path, _answering_errors(handler), methods=["POST"])
    if tokenizer_info_endpoint:
        app.add_api_route("/tokenizer_info", _answering_errors(_tokenizer_info), methods=["GET"])
    app.add_api_route("/v1/responses/{response_id}", _answering_errors(responses.kept), methods=["GET", "DELETE"])
    app.add_api_route("/v1/responses/{response_id}/cancel", _answering_errors(responses.kept), methods=["POST"])

    return app
