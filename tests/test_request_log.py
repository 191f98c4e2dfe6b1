"""--enable-log-requests with vLLM's --max-log-len: each accepted request's parameters at INFO and at most that
much of its prompt at DEBUG."""

import asyncio
import logging
import random

from deltaserve import SamplingParams
from deltaserve.engine.async_engine import AsyncEngine


def test_the_logged_prompt_is_cut_at_max_log_len(checkpoint_factory, caplog):
    cut = random.randint(1, 6)
    engine = AsyncEngine.from_args(checkpoint_factory("llama"), device="cpu", log_requests=True, max_log_len=cut)
    prompts = {"ids": [random.randrange(3, 300) for _ in range(cut + random.randint(1, 20))],
               "text": "The capital of France is a city of many bridges"}

    async def serve():
        engine.start()
        try:
            for name, prompt in prompts.items():
                stream = await engine.generate(name, prompt, SamplingParams(max_tokens=2))
                async for _ in stream:
                    pass
                stream.close()
        finally:
            engine.stop()

    with caplog.at_level(logging.DEBUG, logger="deltaserve"):
        asyncio.run(serve())
    logged = {r.getMessage().split()[1]: r.getMessage() for r in caplog.records if " prompt: " in r.getMessage()}
    assert logged["ids"].endswith(f"prompt: {prompts['ids'][:cut]!r}")
    assert logged["text"].endswith(f"prompt: {prompts['text'][:cut]!r}")
    assert all(f"request {name} accepted: SamplingParams(" in caplog.text for name in prompts)
