"""Requests arriving one at a time while others decode, on an LLM's engine: a prompt alone, prompts joining
sequences that decode (one whose prompt lookups always hit among them), and a prefix-cache hit's follow-up."""

import random

from deltaserve import LLM, SamplingParams
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


def arrival_requests(plain: LLM, rng: random.Random, max_tokens: int) -> tuple[dict, SamplingParams, dict, dict]:
    """arrival_prompts with "follow-up" after the first turn's greedy output; the greedy parameters; each prompt's
    greedy tokens by `plain` (an engine that does not draft); seeded sampling parameters for each prompt."""
    prompts = arrival_prompts(rng)
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    first = plain.generate([prompts["first"]], greedy, use_tqdm=False)[0].outputs[0].token_ids
    prompts["follow-up"] = prompts["first"] + first + prompts["follow-up"]
    expected = {name: o.outputs[0].token_ids
                for name, o in zip(prompts, plain.generate(list(prompts.values()), greedy, use_tqdm=False))}
    seeded = {name: SamplingParams(temperature=0.9, seed=rng.randrange(2**31), max_tokens=max_tokens, ignore_eos=True)
              for name in prompts}
    return prompts, greedy, expected, seeded
