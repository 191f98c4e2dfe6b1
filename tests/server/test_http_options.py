"""vLLM's HTTP options: CORS (any origin by default), several API keys, request ids in the headers, a root path
behind a proxy, TLS, and uvicorn's log options, given on the command line or in a --config file; wrong values
end the start with the reason."""

from __future__ import annotations

import json
import logging
import random
import socket
import ssl
import subprocess
import uuid

import httpx
import pytest
from starlette.testclient import TestClient

from deltaserve.cli import _build_parser
from deltaserve.errors import DeltaServeError
from deltaserve.server.app import APIKeyMiddleware
from deltaserve.server.http_options import AccessLogFilter, check_http_arguments, filter_access_log, uvicorn_options
from tests.server.conftest import MODEL, serving
from tests.server.live_server import LiveServer

pytestmark = pytest.mark.timeout(400)

ORIGIN = "https://ui.example"
TEMPLATE = ("{% for m in messages %}[{{ m.role }} {{ flavour | default('plain') }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
KEYS = [f"sk-{uuid.uuid4().hex[:12]}", f"sk-{uuid.uuid4().hex[:12]}"]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    folder = tmp_path_factory.mktemp("tls")
    key, cert = str(folder / "key.pem"), str(folder / "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return key, cert


@pytest.fixture(scope="module")
def front(certificate, tmp_path_factory):
    """Its HTTP options from a --config file (its port, 9, under the line's --port 0), its keys and TLS files
    on the command line."""
    key, cert = certificate
    config = tmp_path_factory.mktemp("config") / "serve.yaml"
    template = config.parent / "flavoured.jinja"
    template.write_text(TEMPLATE)
    config.write_text(f"allowed-origins: [\"{ORIGIN}\"]\nallow-credentials: true\n"
                      "enable-request-id-headers: true\nroot-path: /proxied\nuvicorn-log-level: warning\n"
                      f"disable_uvicorn_access_log: true\nport: 9\nchat-template: {template}\n"
                      "default-chat-template-kwargs: {flavour: house}\ntrust-request-chat-template: true\n")
    yield from serving(LiveServer("--served-model-name", MODEL, "--config", str(config), "--api-key", *KEYS,
                                  "--ssl-keyfile", key, "--ssl-certfile", cert))


def _client(front, certificate) -> httpx.Client:
    return httpx.Client(base_url=front.url, verify=ssl.create_default_context(cafile=certificate[1]), timeout=60)


def test_tls_keys_request_ids_and_the_root_path(front, certificate):
    """The root path is the prefix a proxy strips before the request reaches the server (uvicorn's root_path):
    routes, open paths and error shapes stay where they were."""
    assert front.url.startswith("https://")
    with _client(front, certificate) as client:
        for key in KEYS:  # either key
            r = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL
        r = client.get("/v1/models", headers={"Authorization": "Bearer sk-none"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        given = uuid.uuid4().hex
        r = client.get("/v1/models", headers={"x-api-key": KEYS[1], "X-Request-Id": given})
        assert r.headers["x-request-id"] == given
        made = [client.get("/health") for _ in range(2)]  # open without a key under the root path too
        assert all(r.status_code == 200 for r in made)
        ids = [r.headers["x-request-id"] for r in made]
        assert ids[0] != ids[1] and all(len(i) == 32 for i in ids)
        r = client.post("/v1/messages", json={})  # Anthropic's error shape under the root path too
        assert r.status_code == 401 and r.json()["type"] == "error", r.text
    with pytest.raises(httpx.HTTPError):  # plain HTTP on a TLS port
        httpx.get(front.url.replace("https://", "http://") + "/health", timeout=10)


def test_cors_answers_the_allowed_origin_alone(front, certificate):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    with _client(front, certificate) as client:
        r = client.options("/v1/chat/completions", headers=preflight)
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == ORIGIN
        assert r.headers["access-control-allow-credentials"] == "true"
        r = client.options("/v1/chat/completions", headers={**preflight, "Origin": "https://other.example"})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        r = client.post("/v1/chat/completions", json=body,
                        headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEYS[0]}"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
        r = client.post("/v1/chat/completions", json=body, headers={"Origin": ORIGIN})  # the browser sees the 401
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN


def test_any_origin_by_default(server):
    r = httpx.options(server.base_url + "/chat/completions", timeout=30,
                      headers={"Origin": f"https://{uuid.uuid4().hex[:8]}.example",
                               "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    assert "x-request-id" not in httpx.get(server.url + "/health", timeout=30).headers


def test_the_options_reach_uvicorn_and_wrong_values_are_named():
    parse = _build_parser().parse_args
    args = parse(["serve", "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--root-path", "/p",
                  "--uvicorn-log-level", "error", "--ssl-cert-reqs", "2"])
    assert uvicorn_options(args) == {"log_level": "error", "access_log": False, "root_path": "/p",
                                     "ssl_keyfile": "k.pem", "ssl_certfile": "c.pem", "ssl_ca_certs": None,
                                     "ssl_cert_reqs": 2}
    assert uvicorn_options(parse(["serve", "--log-level", "debug"]))["access_log"] is True
    assert uvicorn_options(parse(["serve", "--log-level", "debug", "--disable-uvicorn-access-log"]))[
        "access_log"] is False
    with pytest.raises(DeltaServeError, match="--ssl-keyfile and --ssl-certfile go together"):
        check_http_arguments(parse(["serve", "--ssl-keyfile", "k.pem"]))
    # found before the model loads: a port past 65535 bound another (its value modulo 65536), missing files raised
    # a traceback after loading
    for port in (70000, -5):
        with pytest.raises(DeltaServeError, match=f"--port {port}"):
            check_http_arguments(parse(["serve", "--port", str(port)]))
    missing = f"/nonexistent/{uuid.uuid4().hex}.pem"
    with pytest.raises(DeltaServeError, match=f"--ssl-keyfile {missing}: no such file"):
        check_http_arguments(parse(["serve", "--ssl-keyfile", missing, "--ssl-certfile", missing]))
    two = [ORIGIN, "http://b.example"]
    for line, origins in ((["--allowed-origins", json.dumps(two)], two), (["--allowed-origins", *two], two), ([], ["*"])):
        args = parse(["serve", "--port", "0", *line])
        check_http_arguments(args)
        assert args.allowed_origins == origins and args.allowed_methods == args.allowed_headers == ["*"]
    for wrong, why in (("[\"a\", ", "not JSON"), ('{"a": 1}', "JSON list of strings"), ("[1]", "JSON list of strings")):
        with pytest.raises(DeltaServeError, match=f"--allowed-headers .*{why}"):
            check_http_arguments(parse(["serve", "--port", "0", "--allowed-headers", wrong]))


def _access_line(path: str) -> logging.LogRecord:
    """A record as uvicorn's access logger makes it."""
    return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 0, '%s - "%s %s HTTP/%s" %d',
                             ("127.0.0.1:5000", "GET", path, "1.1", 200), None)


def test_the_access_log_leaves_out_the_paths_given():
    """vLLM's comma-separated paths, matched without the query string, and with the root path uvicorn puts in
    front of each request's path or without it."""
    quiet = AccessLogFilter(["/health", "/metrics"], root_path="/proxied/")
    for path in ("/health", "/metrics?name=x", "/proxied/health", "/proxied/metrics"):
        assert not quiet.filter(_access_line(path)), path
    for path in ("/healthz", "/v1/models", "/other/health", "/v1/health"):
        assert quiet.filter(_access_line(path)), path
    assert quiet.filter(logging.LogRecord("uvicorn.access", logging.INFO, __file__, 0, "no args", None, None))
    args = _build_parser().parse_args(["serve", "--port", "0", "--disable-access-log-for-endpoints",
                                       " /health, ,/metrics", "--root-path", "/p"])
    check_http_arguments(args)
    access = logging.getLogger("uvicorn.access")
    try:
        filter_access_log(args)
        filter_access_log(args)  # once, however often a server starts in this process
        [installed] = [f for f in access.filters if isinstance(f, AccessLogFilter)]
        assert installed.paths == {"/health", "/metrics", "/p/health", "/p/metrics"}
    finally:
        filter_access_log(_build_parser().parse_args(["serve"]))
    assert not [f for f in access.filters if isinstance(f, AccessLogFilter)]
    with pytest.raises(DeltaServeError, match="--disable-access-log-for-endpoints: 'health' is no path"):
        check_http_arguments(_build_parser().parse_args(["serve", "--port", "0",
                                                         "--disable-access-log-for-endpoints", "/ping,health"]))


@pytest.fixture(scope="module")
def logging_server():
    """A server that writes an access-log line per request (--log-level debug), but for /health and /metrics."""
    yield from serving(LiveServer("--log-level", "debug", "--root-path", "/proxied",
                                  "--disable-access-log-for-endpoints", "/health,/metrics"))


def test_a_live_servers_access_log_leaves_out_the_paths_given(logging_server):
    for path in ("/health", "/metrics", "/version", "/health?probe=1", "/ping"):
        assert httpx.get(logging_server.url + path, timeout=30).status_code == 200, path
    with open(logging_server.stdout.name) as f:
        lines = [line for line in f if "HTTP/1.1" in line]
    assert any('"GET /proxied/version HTTP/1.1" 200' in line for line in lines), lines
    assert any('"GET /proxied/ping HTTP/1.1" 200' in line for line in lines), lines
    assert not [line for line in lines if "/health" in line or "/metrics" in line], lines


def test_a_port_taken_and_an_empty_api_key_end_the_start_before_the_model_loads():
    parse = _build_parser().parse_args
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DeltaServeError, match=f"--host 127.0.0.1 --port {port}: cannot listen there"):
            check_http_arguments(parse(["serve", "--port", str(port)]))
    check_http_arguments(parse(["serve", "--port", str(port)]))  # free again
    # an unset variable in `--api-key "$OLD" "$NEW"` let every request in: one without the header matched it
    for keys in ([""], [KEYS[0], ""], ["  "]):
        with pytest.raises(DeltaServeError, match="--api-key: a key is empty"):
            check_http_arguments(parse(["serve", "--port", "0", "--api-key", *keys]))


def test_the_key_may_come_from_vllms_variable(monkeypatch):
    """A deployment written for vLLM sets VLLM_API_KEY: it was ignored, and the server took every request."""
    from deltaserve.server.launcher import environment_api_keys

    ours, theirs = KEYS
    monkeypatch.delenv("DELTASERVE_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert environment_api_keys() == []
    monkeypatch.setenv("VLLM_API_KEY", theirs)
    assert environment_api_keys() == [theirs]
    monkeypatch.setenv("DELTASERVE_API_KEY", ours)
    assert environment_api_keys() == [ours]


def test_a_request_without_a_key_never_passes():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"in"})

    key = random.choice(KEYS)
    client = TestClient(APIKeyMiddleware(app, ["", key]))  # not entered: the app has no lifespan to run
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer ", "x-api-key": ""}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert client.get("/v1/models", headers={"x-api-key": key}).status_code == 200


def test_default_chat_template_kwargs_lie_under_a_requests_own(front, certificate):
    """--default-chat-template-kwargs (here from the config file) render every chat, on every route that
    renders one, unless the request's own chat_template_kwargs say otherwise."""
    word = f"w{uuid.uuid4().hex[:6]}"
    messages = [{"role": "user", "content": word}]
    headers = {"Authorization": f"Bearer {KEYS[0]}"}
    with _client(front, certificate) as client:
        def rendered(**fields) -> str:
            ids = client.post("/tokenize", json={"model": MODEL, "messages": messages, **fields}, headers=headers)
            text = client.post("/detokenize", json={"model": MODEL, "tokens": ids.json()["tokens"]}, headers=headers)
            return text.json()["prompt"]

        assert rendered() == f"[user house] {word}\n[assistant]"
        assert rendered(chat_template_kwargs={"flavour": "own"}) == f"[user own] {word}\n[assistant]"
        body = {"model": MODEL, "messages": messages, "max_tokens": 1}
        house = client.post("/v1/chat/completions", json=body, headers=headers).json()["usage"]["prompt_tokens"]
        own = client.post("/v1/chat/completions", headers=headers,
                          json={**body, "chat_template_kwargs": {"flavour": "house house house"}})
        assert own.json()["usage"]["prompt_tokens"] > house == len(client.post(
            "/tokenize", json={"model": MODEL, "messages": messages}, headers=headers).json()["tokens"])
        # the Messages routes take them as vLLM's do: counted, and rendered for the reply
        flavour = {"chat_template_kwargs": {"flavour": "house house house"}}
        counted = [client.post("/v1/messages/count_tokens", headers=headers,
                               json={"model": MODEL, "messages": messages, **fields}).json()["input_tokens"]
                   for fields in ({}, flavour)]
        replied = client.post("/v1/messages", headers=headers, json={"model": MODEL, "messages": messages,
                                                                     "max_tokens": 1, **flavour}).json()
        read = replied["usage"]["input_tokens"] + replied["usage"]["cache_read_input_tokens"]  # the chat's cached
        assert counted == [house, own.json()["usage"]["prompt_tokens"]] == [house, read]


def test_a_requests_own_chat_template_needs_the_servers_trust(front, certificate, server):
    word = f"w{uuid.uuid4().hex[:6]}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": word}], "max_tokens": 1,
            "chat_template": "<<{{ messages[0]['content'] }}|{{ flavour }}>>"}
    headers = {"Authorization": f"Bearer {KEYS[0]}"}
    with _client(front, certificate) as client:
        r = client.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
        tokens = client.post("/tokenize", headers=headers, json={"model": MODEL, "prompt": f"<<{word}|house>>",
                                                                 "add_special_tokens": False}).json()["count"]
        assert r.json()["usage"]["prompt_tokens"] == tokens  # its template, the server's variables under it
        # reasoning_effort reaches the template as vLLM hands it: itself, and enable_thinking unless "none"
        effort = random.choice(["none", "low", "high"])
        r = client.post("/v1/chat/completions", headers=headers, json={
            **body, "reasoning_effort": effort, "chat_template": "<<{{ reasoning_effort }}|{{ enable_thinking }}>>"})
        tokens = client.post("/tokenize", headers=headers, json={
            "model": MODEL, "prompt": f"<<{effort}|{effort != 'none'}>>", "add_special_tokens": False}).json()["count"]
        assert r.json()["usage"]["prompt_tokens"] == tokens, r.text
        # as vLLM's: documents reach the template; where it knows no developer, a developer's message is a
        # system's, and the first; a tool's fields not given are null
        title = f"t{uuid.uuid4().hex[:6]}"
        r = client.post("/v1/chat/completions", headers=headers, json={
            **body, "messages": [{"role": "user", "content": word}, {"role": "developer", "content": "dev"}],
            "documents": [{"title": title, "text": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
            "chat_template": "<<{{ documents[0].title }}|{{ messages[0].role }}:{{ messages[0].content }}|"
                             "{{ tools[0].function.description }}>>"})
        tokens = client.post("/tokenize", headers=headers, json={
            "model": MODEL, "prompt": f"<<{title}|system:dev|None>>", "add_special_tokens": False}).json()["count"]
        assert r.json()["usage"]["prompt_tokens"] == tokens, r.text
        # tool_choice "none" still shows the template the tools, as vLLM's (unless its exclude flag)
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        shown = "<<{% if tools %}tools {{ tools | length }}{% else %}none{% endif %}>>"
        asked = ({"tools": [tool], "tool_choice": "none"}, {"tools": [tool], "tool_choice": "auto"}, {})
        counts = [client.post("/v1/chat/completions", headers=headers, json={
            **body, "chat_template": shown, **fields}).json()["usage"]["prompt_tokens"] for fields in asked]
        expected = [client.post("/tokenize", headers=headers, json={
            "model": MODEL, "prompt": text, "add_special_tokens": False}).json()["count"]
            for text in ("<<tools 1>>", "<<tools 1>>", "<<none>>")]
        assert counts == expected
        r = client.post("/v1/chat/completions", json={**body, "chat_template": "{% for m in messages %}"},
                        headers=headers)
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
    r = httpx.post(server.base_url + "/chat/completions", json=body, headers=server.headers, timeout=30)
    assert r.status_code == 400 and "--trust-request-chat-template" in r.json()["error"]["message"]

