"""`deltaserve serve`: load the engine, run uvicorn, stop cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import uvicorn

from deltaserve.engine.async_engine import AsyncEngine
from deltaserve.engine.sampling_defaults import describe
from deltaserve.errors import DeltaServeError
from deltaserve.server.app import build_app
from deltaserve.server.http_options import (add_http_middleware, check_http_arguments, filter_access_log,
                                           uvicorn_options)
from deltaserve.server.stats_log import log_stats_interval
from deltaserve.server.vllm_flags import check_vllm_flags

logger = logging.getLogger("deltaserve.server")

API_KEY_ENV = "DELTASERVE_API_KEY"
VLLM_API_KEY_ENV = "VLLM_API_KEY"  # vLLM's: a deployment written for vLLM sets its key there


def environment_api_keys() -> list[str]:
    """The key --api-key leaves to the environment: DELTASERVE_API_KEY, else vLLM's VLLM_API_KEY (none where
    both are unset or empty)."""
    key = os.environ.get(API_KEY_ENV) or os.environ.get(VLLM_API_KEY_ENV)
    return [key] if key else []


class _Server(uvicorn.Server):
    """uvicorn's server, plus: print the URL once bound, on shutdown let the requests in flight finish for up to
    shutdown_timeout seconds and then end their streams before the connections close, and exit normally after a
    signal instead of re-raising it."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, served: list[str], shutdown_timeout: int = 0):
        super().__init__(config)
        self.engine = engine
        self.served = served
        self.shutdown_timeout = shutdown_timeout
        self.url: str | None = None
        self._streams_ended = False
        self._drain_deadline: float | None = None
        self._hurried = False  # a second signal came: stop waiting for the requests in flight

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if not self.started or not self.servers:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if self.config.ssl_keyfile else 'http'}://{shown}:{port}"
        print(f"deltaserve: serving {', '.join(self.served)} at {self.url}/v1 (Ctrl+C to stop)", flush=True)

    async def on_tick(self, counter: int) -> bool:
        should_exit = await super().on_tick(counter)
        if not should_exit or self._streams_ended:
            return should_exit
        if self._draining():
            return False  # uvicorn goes on serving: new requests get a 503, those in flight their tokens
        self._streams_ended = True
        self.engine.begin_shutdown()  # streams still open end with an error event, then connections close
        return True

    def _draining(self) -> bool:
        """Whether the shutdown still waits for requests in flight (vLLM's --shutdown-timeout; 0: none). New ones
        are refused from the signal on; the wait ends when none is left, when its seconds are up, or at a second
        signal."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.shutdown_timeout
            self.engine.refuse_new()
            count = self.engine.num_busy
            if self.shutdown_timeout and count:
                print(f"deltaserve: stopping: waiting up to {self.shutdown_timeout} s for {count} "
                      f"request{'s' if count > 1 else ''} in flight (a second signal stops at once)",
                      file=sys.stderr, flush=True)
        return (self.engine.num_busy > 0 and not self._hurried and not self.force_exit
                and time.monotonic() < self._drain_deadline)

    def handle_exit(self, sig: int, frame) -> None:
        if self.should_exit:
            self._hurried = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def engine_kwargs(args: Any) -> dict:
    """The engine options given on the command line (the engine's defaults rule the rest)."""
    names = ("revision", "download_dir", "hf_token", "dtype", "device", "max_model_len", "max_num_seqs",
             "max_num_batched_tokens", "block_size", "num_kv_blocks", "seed", "enable_prefix_caching", "ssm_snapshot_slots", "ssm_snapshot_interval",
             "decode_snapshot_interval", "gdn_state_dtype", "enforce_eager", "async_scheduling", "load_format",
             "warm_up", "gpu_memory_utilization", "kv_cache_memory_bytes", "generation_config",
             "override_generation_config", "chat_template", "chat_template_content_format", "max_logprobs", "logprobs_mode",
             "scheduling_policy", "profiler_config", "quantization")
    kwargs = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    whole_cache = getattr(args, "mamba_cache_dtype", None)  # vLLM's: the GDN state's, where nothing names it
    if whole_cache is not None and "gdn_state_dtype" not in kwargs:
        kwargs["gdn_state_dtype"] = whole_cache
    speculative = speculative_config(args)
    if speculative is not None:
        kwargs["speculative_config"] = speculative
    return kwargs


def speculative_config(args: Any) -> dict | None:
    """--speculative-config with vLLM's key-by-key flags (--spec-method, --spec-tokens) merged in; a key given
    both ways is refused, as vLLM refuses it."""
    config = getattr(args, "speculative_config", None)
    for flag, key, value in (("--spec-method", "method", getattr(args, "spec_method", None)),
                             ("--spec-tokens", "num_speculative_tokens", getattr(args, "spec_tokens", None))):
        if value is None:
            continue
        config = dict(config or {})
        if key in config:
            raise DeltaServeError(f"{flag} and --speculative-config's {key!r} are mutually exclusive: give one")
        config[key] = value
    return config


def serve(args: Any) -> int:
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(name)s: %(message)s")
    api_keys = args.api_key or environment_api_keys()
    reasoning = check_vllm_flags(args)  # before the model loads: a flag it cannot honour ends the start at once
    check_http_arguments(args)
    stats_interval = log_stats_interval(bool(getattr(args, "disable_log_stats", False)))
    print(f"deltaserve: loading {args.model or 'the demo model'} ...", file=sys.stderr, flush=True)
    engine = AsyncEngine.from_args(args.model, max_queue=args.max_queue,
                                   log_requests=bool(getattr(args, "enable_log_requests", False)),
                                   max_log_len=getattr(args, "max_log_len", None),
                                   **engine_kwargs(args))
    served = args.served_model_name or [engine.model_name]
    if engine.sampling_defaults:
        print(f"deltaserve: requests that leave them unset sample with the generation config's "
              f"{describe(engine.sampling_defaults)} (--generation-config vllm for the API's defaults)",
              file=sys.stderr, flush=True)
    if engine.max_tokens_cap is not None:
        print(f"deltaserve: no request generates more than {engine.max_tokens_cap} tokens (the generation config's "
              "max_new_tokens)", file=sys.stderr, flush=True)
    app = build_app(engine, served, api_key=api_keys, reasoning=reasoning,
                    force_include_usage=bool(getattr(args, "enable_force_include_usage", False)),
                    return_tokens_as_token_ids=bool(getattr(args, "return_tokens_as_token_ids", False)),
                    default_chat_template_kwargs=getattr(args, "default_chat_template_kwargs", None),
                    trust_request_chat_template=bool(getattr(args, "trust_request_chat_template", False)),
                    response_role=getattr(args, "response_role", None) or "assistant",
                    log_stats_interval=stats_interval,
                    tool_call_parser=getattr(args, "tool_call_parser", None),
                    exclude_tools_when_tool_choice_none=bool(getattr(args, "exclude_tools_when_tool_choice_none",
                                                                     False)),
                    tokenizer_info_endpoint=bool(getattr(args, "enable_tokenizer_info_endpoint", False)))
    add_http_middleware(app, args)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=5,
        **uvicorn_options(args),
    )
    filter_access_log(args)  # after uvicorn.Config, which sets its loggers up
    server = _Server(config, engine, served, shutdown_timeout=getattr(args, "shutdown_timeout", 0))
    server.run()
    engine.stop()
    print("deltaserve: stopped", file=sys.stderr, flush=True)
    return 0 if server.started else 1
