"""APIError and the mapping from every failure to an HTTP status and an error body.

OpenAI routes answer `{"error": {"message", "type", "param", "code"}}`; the Anthropic route
answers `{"type": "error", "error": {"type", "message"}}`. Bad input is always a 4xx.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from deltaserve.engine.async_engine import (QueueFullError, RequestFailedError, RequestIdInUseError,
                                            ServerShuttingDownError)
from deltaserve.errors import (
    EngineDeadError,
    InvalidPromptError,
    InvalidSamplingParamsError,
    NoTokenAllowedError,
    PromptTooLongError,
)

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def openai_body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(self.status, "api_error"), "message": self.message}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def require_fields(part: Any, fields: tuple[str, ...], what: str, where: str) -> None:
    """A 400 naming the first of `fields` that `part` (a content block or input item, `what` it is) lacks."""
    missing = [name for name in fields if getattr(part, name) is None]
    if missing:
        raise bad_request(f"a {what} needs {' and '.join(missing)}", f"{where}.{missing[0]}")


def context_length_error(prompt_tokens: int, max_tokens: int, max_model_len: int, param: str = "messages") -> APIError:
    return APIError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
        "completion). Please reduce the length of the prompt or of max_tokens.",
        param=param,
        code="context_length_exceeded",
    )


_TYPE_TAGS = {"int", "float", "str", "bool", "dict", "list", "none", "union", "literal", "tagged-union",
              "function-after", "function-before", "function-wrap", "function-plain", "json-or-python"}


def _field_path(loc: tuple) -> str:
    """The request field an error is about: list indexes kept, pydantic's union-member tags dropped."""
    parts = []
    for part in loc:
        if isinstance(part, int):
            parts.append(str(part))
        elif part != "body" and part.isidentifier() and part not in _TYPE_TAGS and not part[:1].isupper():
            parts.append(part)
    return ".".join(parts)


def from_validation_error(exc: ValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0]
    # Where a union's members all fail and one of them failed inside the value (content given as blocks, one
    # block without its type or its text not a string), that is the error, not the first member's type (not a
    # string): a field missing there first, else the deepest error there, where one member got deepest (in a
    # list of lists of token ids, the id that is not one; a list mixing strings and ids stays the union's).
    path = _field_path(tuple(first.get("loc", ())))
    inside = [e for e in errors if _field_path(tuple(e.get("loc", ()))).startswith(path + ".")]
    if first.get("type", "").endswith("_type") and inside:
        first = next((e for e in inside if e.get("type") == "missing"), None) or _deepest(inside, first)
    loc = _field_path(tuple(first.get("loc", ())))
    kind = first.get("type", "")
    if kind == "missing":
        message = f"Missing required field: '{loc}'"
    else:
        message = f"Invalid value for '{loc}': {_what_fits(errors, loc)}"
    return APIError(400, message, param=loc or None, code="missing_required_parameter" if kind == "missing" else "invalid_value")


def _deepest(inside: list[dict], union_error: dict) -> dict:
    """The deepest of the errors inside a union's value where they all come from one member (the member the
    value's shape chose), else the union's own error."""
    def depth(e: dict) -> int:
        return len(_field_path(tuple(e.get("loc", ()))).split("."))

    most = max(map(depth, inside))
    deepest = [e for e in inside if depth(e) == most]
    member = len(union_error.get("loc", ())) - 1  # the union member's tag closes the union error's loc
    return deepest[0] if len({e["loc"][member] for e in deepest}) == 1 else union_error


def _what_fits(errors: list[dict], loc: str) -> str:
    """The first field's message; where it is a union, each member's ("a valid integer or a valid number")."""
    msgs = ["Input should be an object" if e.get("type") == "model_type" else e.get("msg", "invalid")  # no class names
            for e in errors if _field_path(tuple(e.get("loc", ()))) == loc]
    prefix = "Input should be "
    if len(msgs) > 1 and all(m.startswith(prefix) for m in msgs):
        return prefix + " or ".join(dict.fromkeys(m[len(prefix):] for m in msgs))
    return msgs[0]


def from_exception(exc: BaseException) -> APIError:
    """The APIError an exception stands for; unknown failures are a 500 (never bad input)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValidationError):
        return from_validation_error(exc)
    if isinstance(exc, NoTokenAllowedError):
        return APIError(400, str(exc), param=exc.fields[0], code="no_token_allowed")
    if isinstance(exc, InvalidSamplingParamsError):
        match = re.match(r"([\w.]+)[=:]", str(exc))  # the field the message starts with ("name=value: why")
        return APIError(400, str(exc), param=match.group(1) if match else None, code="invalid_value")
    if isinstance(exc, PromptTooLongError):
        return APIError(400, str(exc), param="prompt", code="context_length_exceeded")
    if isinstance(exc, InvalidPromptError):
        return APIError(400, str(exc), param="prompt", code="invalid_prompt")
    if isinstance(exc, RequestIdInUseError):
        return APIError(400, str(exc), param="request_id", code="duplicate_request_id")
    if isinstance(exc, QueueFullError):
        return APIError(503, str(exc), type="server_overloaded", code="queue_full", headers={"Retry-After": "1"})
    if isinstance(exc, ServerShuttingDownError):
        return APIError(503, str(exc), type="service_unavailable", code="shutting_down")
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), type="service_unavailable", code="engine_dead")
    if isinstance(exc, RequestFailedError):
        return APIError(500, str(exc), type="internal_error", code="engine_step_failed")
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="internal_error")
