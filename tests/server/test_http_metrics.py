"""The HTTP series of vLLM's /metrics (prometheus-fastapi-instrumentator's names and labels): counted by method,
status class and route template, sizes from Content-Length, durations over a stream's whole body; probes and
/metrics left out."""

import asyncio
import random

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from deltaserve.server.http_metrics import HttpMetrics, HttpMetricsMiddleware

PAUSE = 0.02  # each streamed piece waits this long


def _app(registry: CollectorRegistry) -> Starlette:
    async def item(request):
        return JSONResponse({"id": request.path_params["item_id"]})

    async def stream(request):
        pieces = int((await request.body()).decode())

        async def body():
            for i in range(pieces):
                await asyncio.sleep(PAUSE)
                yield f"piece {i}\n"
        return StreamingResponse(body(), media_type="text/plain")

    async def fail(request):
        raise RuntimeError("broken route")

    async def health(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/items/{item_id}", item, methods=["GET"]),
                            Route("/stream", stream, methods=["POST"]), Route("/fail", fail),
                            Route("/health", health)])
    app.add_middleware(HttpMetricsMiddleware, metrics=HttpMetrics(registry), router=app.router)
    return app


def _samples(registry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode()) for s in family.samples}


def test_requests_are_counted_by_route_template_status_class_and_method():
    rng, registry = random.Random(), CollectorRegistry()
    counts = {name: rng.randint(1, 4) for name in ("item", "post_item", "missing", "stream", "fail", "health")}
    pieces = [rng.randint(1, 4) for _ in range(counts["stream"])]

    async def traffic():
        transport = httpx.ASGITransport(app=_app(registry), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            sizes = []
            for _ in range(counts["item"]):
                r = await client.get(f"/v1/items/{rng.randrange(10**6)}")
                sizes.append(int(r.headers["content-length"]))
            for _ in range(counts["post_item"]):
                r = await client.post("/v1/items/7")
                assert r.status_code == 405  # the path's route, not its method: counted under its template
                sizes.append(int(r.headers["content-length"]))
            for _ in range(counts["missing"]):
                assert (await client.get(f"/nowhere/{rng.randrange(100)}")).status_code == 404
            for n in pieces:
                assert (await client.post("/stream", content=str(n))).text.count("piece") == n
            for _ in range(counts["fail"]):
                assert (await client.get("/fail")).status_code == 500
            for _ in range(counts["health"]):
                assert (await client.get("/health")).status_code == 200
            return sizes

    item_sizes = asyncio.run(traffic())  # the route's answers, 405s included
    got = _samples(registry)

    def total(method, status, handler):
        return got.get(("http_requests_total", (("handler", handler), ("method", method), ("status", status))), 0)

    assert total("GET", "2xx", "/v1/items/{item_id}") == counts["item"]
    assert total("POST", "4xx", "/v1/items/{item_id}") == counts["post_item"]
    assert total("GET", "4xx", "none") == counts["missing"]
    assert total("POST", "2xx", "/stream") == counts["stream"]
    assert total("GET", "5xx", "/fail") == counts["fail"]
    assert not any(name == "http_requests_total" and ("handler", "/health") in labels for name, labels in got)
    counted = sum(v for (name, _), v in got.items() if name == "http_requests_total")
    assert counted == sum(counts.values()) - counts["health"]
    assert got[("http_request_duration_highr_seconds_count", ())] == counted
    assert got[("http_response_size_bytes_sum", (("handler", "/v1/items/{item_id}"),))] == sum(item_sizes)
    assert got[("http_request_size_bytes_sum", (("handler", "/stream"),))] == sum(len(str(n)) for n in pieces)
    # a stream's duration runs to its last piece
    streamed = got[("http_request_duration_seconds_sum", (("handler", "/stream"), ("method", "POST")))]
    assert streamed >= PAUSE * sum(pieces) * 0.9
