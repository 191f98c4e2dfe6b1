"""Requests arriving one at a time while others decode, on an LLM's engine: a prompt alone, prompts joining
sequences that decode (one whose prompt lookups always hit among them), and a prefix-cache hit's follow-up."""

import random

from deltaserve import LLM
from tests.checkpoints import VOCAB


def arrivals(llm: LLM, prompts: dict, params) -> dict:
    """"first" run alone; "a" (its lookups hit) and "b" decoding, joined by "fresh" and then by "follow-up" (a
    prefix-cache hit on "first"'s history), each arriving alone while the others decode: {name: its tokens}."""
    engine, done = llm.engine, {}

    def step():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids

    def add(name):
        engine.add_request(name, prompts[name], params[name] if isinstance(params, dict) else params)

    add("first")
    while "first" not in done:
        step()
    for name in ("a", "b", None, None, "fresh", None, None, "follow-up"):  # None: a step
        if name is None:
            step()
        else:
            add(name)
    while engine.has_unfinished_requests():
        step()
    return done


def arrival_prompts(rng: random.Random) -> dict:
    """The prompts `arrivals` sends; "follow-up" holds only its new message, for the caller to put the first
    turn (its prompt and output) before."""
    history = [rng.randrange(3, VOCAB) for _ in range(rng.randint(40, 90))]
    prompts = {"first": history, "a": rng.sample(range(3, VOCAB), VOCAB - 3),  # whatever its last token, it stood
               "b": [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 12))],  # before: lookups hit
               "fresh": [rng.randrange(3, VOCAB) for _ in range(rng.randint(20, 100))]}
    prompts["follow-up"] = [rng.randrange(3, VOCAB) for _ in range(rng.randint(20, 50))]  # after the first turn
    return prompts
