"""What the tests of the whole-answer tool-call formats share: random calls and argument values, a text cut into
random stream pieces, and a parser fed them all."""

from __future__ import annotations

import random


def random_value(rng: random.Random, strings: list[str], depth: int = 0):
    """A JSON value: numbers, one of `strings`, booleans and null, and lists and objects of them two deep."""
    kind = rng.randrange(6 if depth < 2 else 4)
    if kind == 0:
        return rng.randint(-10**6, 10**6)
    if kind == 1:
        return rng.choice(strings)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return round(rng.uniform(-100, 100), 3)
    if kind == 4:
        return [random_value(rng, strings, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": random_value(rng, strings, depth + 1) for i in range(rng.randint(0, 3))}


def random_calls(rng: random.Random, names: list[str], strings: list[str]) -> list[tuple[str, dict]]:
    """One to three (name, arguments) pairs: names from `names`, up to four arguments of random values."""
    return [(rng.choice(names), {f"p{i}": random_value(rng, strings) for i in range(rng.randint(0, 4))})
            for _ in range(rng.randint(1, 3))]


def cut(text: str, rng: random.Random) -> list[str]:
    """`text` in pieces of 1 to 7 characters, as a stream may deliver it."""
    pieces, at = [], 0
    while at < len(text):
        step = rng.randint(1, 7)
        pieces.append(text[at:at + step])
        at += step
    return pieces


def feed_all(parser, pieces: list[str]) -> tuple[str, list]:
    """The text and the calls the parser gives back for the pieces fed in order, then its finish."""
    text, calls = "", []
    for piece in pieces:
        out = parser.feed(piece)
        text, calls = text + out.text, calls + out.tool_calls
    out = parser.finish()
    return text + out.text, calls + out.tool_calls
