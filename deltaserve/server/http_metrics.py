"""The HTTP series that vLLM's server exports on /metrics beside its own, under the names and labels that
prometheus-fastapi-instrumentator's defaults give them: requests by method, status class and route, the sizes
their Content-Length headers give, and their durations (a stream's whole body included). Routes are named by
their templates ("/v1/responses/{response_id}"); a path no route takes is "none". The routes that vLLM leaves
out (probes and /metrics itself) are not counted."""

from __future__ import annotations

import re
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from starlette.routing import Match, Router

EXCLUDED = tuple(re.compile(path) for path in ("/metrics", "/health", "/load", "/ping", "/version", "/server_info"))
HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 7.5, 10, 30, 60)
LOWR_BUCKETS = (0.1, 0.5, 1)


class HttpMetrics:
    """The series, made once per registry (a middleware stack built again must not make them twice)."""

    def __init__(self, registry: CollectorRegistry):
        self.total = Counter("http_requests_total", "Total number of requests by method, status and handler.",
                             ["method", "status", "handler"], registry=registry)
        self.request_size = Summary("http_request_size_bytes", "Content length of incoming requests by handler.",
                                    ["handler"], registry=registry)
        self.response_size = Summary("http_response_size_bytes", "Content length of outgoing responses by handler.",
                                     ["handler"], registry=registry)
        self.latency = Histogram("http_request_duration_highr_seconds", "Latency with many buckets but no API "
                                 "specific labels.", buckets=HIGHR_BUCKETS, registry=registry)
        self.handler_latency = Histogram("http_request_duration_seconds", "Latency with only few buckets by handler.",
                                         ["method", "handler"], buckets=LOWR_BUCKETS, registry=registry)

    def observe(self, method: str, status: int, handler: str, request_headers, response_headers,
                seconds: float) -> None:
        self.total.labels(method, f"{str(status)[0]}xx", handler).inc()
        self.request_size.labels(handler).observe(_content_length(request_headers))
        self.response_size.labels(handler).observe(_content_length(response_headers))
        self.latency.observe(seconds)
        self.handler_latency.labels(method, handler).observe(seconds)


class HttpMetricsMiddleware:
    def __init__(self, app, metrics: HttpMetrics, router: Router):
        self.app = app
        self.metrics = metrics
        self.router = router

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        handler = self._handler(scope)
        if any(pattern.search(handler) for pattern in EXCLUDED):
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        response = {"status": 500, "headers": []}  # what an app that fails before it answers gives

        async def sending(message):
            if message["type"] == "http.response.start":
                response.update(status=message["status"], headers=message.get("headers", []))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.observe(scope["method"], response["status"], handler, scope.get("headers", []),
                                 response["headers"], time.perf_counter() - started)

    def _handler(self, scope) -> str:
        """The template of the route that takes the request (one that takes its path but not its method, where
        none takes both), else "none"."""
        partial = None
        for route in self.router.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return route.path
            if match == Match.PARTIAL and partial is None:
                partial = route.path
        return partial or "none"


def _content_length(headers) -> int:
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0
