"""The HTTP front's options under vLLM's names: CORS (every origin by default, as vLLM), a root path behind a
proxy, TLS, uvicorn's own log level and access log (less the paths it should not log), and request ids in the
response headers."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import uuid
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from deltaserve.errors import DeltaServeError


def string_list(flag: str, words: list[str]) -> list[str]:
    """A CORS list as given: vLLM's one JSON list ('["https://a.example"]'), or the items themselves (as a
    config file's YAML list gives them)."""
    if len(words) == 1 and words[0][:1] in "[{\"":
        try:
            value = json.loads(words[0])
        except json.JSONDecodeError as exc:
            raise DeltaServeError(f"{flag} {words[0]}: not JSON ({exc.msg}): give a list such as '[\"*\"]'") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DeltaServeError(f"{flag} {words[0]}: must be a JSON list of strings, such as '[\"*\"]'")
        return value
    return list(words)


class _StringList(argparse.Action):
    """Stores a CORS list as the list it reads as (string_list), when the line (or a config file) is parsed."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, string_list(option_string, values))


def add_http_arguments(p: argparse.ArgumentParser) -> None:
    every = ["*"]  # read, never changed
    p.add_argument("--allowed-origins", nargs="+", action=_StringList, default=every,
                   help="the origins a browser may call from: a JSON list, or the origins (default: any)")
    p.add_argument("--allowed-methods", nargs="+", action=_StringList, default=every,
                   help="CORS methods, as the origins (default: any)")
    p.add_argument("--allowed-headers", nargs="+", action=_StringList, default=every,
                   help="CORS headers, as the origins (default: any)")
    p.add_argument("--allow-credentials", action=argparse.BooleanOptionalAction, default=False,
                   help="CORS: allow credentials")
    p.add_argument("--root-path", default=None, help="the path prefix a proxy serves the API under")
    p.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key (and --ssl-certfile)")
    p.add_argument("--ssl-certfile", default=None, help="the certificate of --ssl-keyfile")
    p.add_argument("--ssl-ca-certs", default=None, help="CA certificates to check clients' certificates with")
    p.add_argument("--ssl-cert-reqs", type=int, default=0,
                   help="whether clients must send a certificate (Python's ssl.CERT_*: 0 none, 1 optional, 2 required)")
    p.add_argument("--uvicorn-log-level", default=None,
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="uvicorn's own log level (default: --log-level)")
    p.add_argument("--disable-uvicorn-access-log", action=argparse.BooleanOptionalAction, default=False,
                   help="no line per HTTP request (the access log is on at --log-level debug alone anyway)")
    p.add_argument("--disable-access-log-for-endpoints", default=None,
                   help="paths whose requests get no access-log line, comma-separated, as /health,/metrics,/ping "
                        "(under --root-path, with or without it)")
    p.add_argument("--enable-request-id-headers", action=argparse.BooleanOptionalAction, default=False,
                   help="answer each request with an X-Request-Id header (the client's own, or a new one)")
    p.add_argument("--disable-fastapi-docs", action=argparse.BooleanOptionalAction, default=False,
                   help="accepted: deltaserve serves no OpenAPI docs pages")


def check_http_arguments(args: Any) -> None:
    """What must hold before the model loads: an address the server can listen on, API keys that are not empty,
    and TLS's key and certificate together, files that exist."""
    port = getattr(args, "port", 0)
    if not 0 <= port <= 65535:
        raise DeltaServeError(f"--port {port}: a port is 0 (any free one) to 65535")
    if port:
        check_address(getattr(args, "host", None) or "127.0.0.1", port)
    if any(not key.strip() for key in getattr(args, "api_key", None) or []):
        # a request without the header reads as an empty key: an empty key would let every request in
        raise DeltaServeError("--api-key: a key is empty (an unset variable in the list?); an empty key would "
                              "let in every request, so give each key its text or leave --api-key out")
    if bool(getattr(args, "ssl_keyfile", None)) != bool(getattr(args, "ssl_certfile", None)):
        raise DeltaServeError("--ssl-keyfile and --ssl-certfile go together: give both, or neither")
    for path in unlogged_paths(args):
        if not path.startswith("/"):  # it would match no request
            raise DeltaServeError(f"--disable-access-log-for-endpoints: {path!r} is no path; a path starts with / "
                                  "(as /health)")
    for flag in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        path = getattr(args, flag, None)
        if path and not os.path.isfile(path):
            raise DeltaServeError(f"--{flag.replace('_', '-')} {path}: no such file")


def check_address(host: str, port: int) -> None:
    """Refuses a host that does not resolve or a port another process listens on, by binding there for a moment
    as uvicorn will (its address family, SO_REUSEADDR, so that a port left in TIME_WAIT passes), before minutes
    of loading a model."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        raise DeltaServeError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None


class RequestIdHeaders:
    """Puts X-Request-Id on every HTTP response: the request's own header where it sent one, else a new id."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id")
        request_id = given if given else uuid.uuid4().hex.encode()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": headers + [(b"x-request-id", request_id)]}
            await send(message)

        return await self.app(scope, receive, send_with_id)


def add_http_middleware(app: FastAPI, args: Any) -> None:
    """CORS outermost, so that a preflight or an error response (a 401 too) carries its headers."""
    if getattr(args, "enable_request_id_headers", False):
        app.add_middleware(RequestIdHeaders)
    app.add_middleware(CORSMiddleware, allow_origins=args.allowed_origins, allow_methods=args.allowed_methods,
                       allow_headers=args.allowed_headers, allow_credentials=args.allow_credentials)


def unlogged_paths(args: Any) -> list[str]:
    """--disable-access-log-for-endpoints' paths: vLLM's one comma-separated string."""
    given = getattr(args, "disable_access_log_for_endpoints", None) or ""
    return [path.strip() for path in given.split(",") if path.strip()]


class AccessLogFilter(logging.Filter):
    """Drops uvicorn's access-log lines of the given paths (a query string aside). uvicorn logs the path with the
    --root-path in front, so a path is matched with and without it."""

    def __init__(self, paths: list[str], root_path: str = ""):
        super().__init__()
        self.paths = set(paths) | {root_path.rstrip("/") + path for path in paths}

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's access line: '%s - "%s %s HTTP/%s" %d' of (client, method, path and query, version, status)
        args = record.args
        if not isinstance(args, tuple) or len(args) < 3 or not isinstance(args[2], str):
            return True
        return args[2].split("?", 1)[0] not in self.paths


def filter_access_log(args: Any) -> None:
    """Puts the AccessLogFilter of --disable-access-log-for-endpoints on uvicorn's access logger; call it once
    uvicorn.Config has set up uvicorn's logging."""
    paths = unlogged_paths(args)
    access = logging.getLogger("uvicorn.access")
    for old in [f for f in access.filters if isinstance(f, AccessLogFilter)]:  # one server's paths at a time
        access.removeFilter(old)
    if paths:
        access.addFilter(AccessLogFilter(paths, getattr(args, "root_path", None) or ""))


def uvicorn_options(args: Any) -> dict[str, Any]:
    """uvicorn.Config's keyword arguments that these options set."""
    options: dict[str, Any] = {
        "log_level": args.uvicorn_log_level or args.log_level,
        "access_log": args.log_level == "debug" and not args.disable_uvicorn_access_log,
    }
    if args.root_path:
        options["root_path"] = args.root_path
    if args.ssl_keyfile:
        options.update(ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs,
                       ssl_cert_reqs=args.ssl_cert_reqs)
    return options
