"""repetition_detection: an output ends once its last tokens are one pattern repeated (vLLM's meaning)."""

import random

import pytest

from deltaserve import LLM, SamplingParams
from deltaserve.engine.repetition import ends_in_repetition
from deltaserve.errors import InvalidSamplingParamsError
from deltaserve.sampling_params import RepetitionDetectionParams


def repeats_brute(tokens: list[int], largest: int, smallest: int, count: int) -> bool:
    """The definition read literally: some pattern length n whose last n tokens, taken `count` times, are the
    output's last n * count."""
    for n in range(max(smallest, 1), largest + 1):
        if n * count <= len(tokens) and tokens[len(tokens) - n * count:] == tokens[len(tokens) - n:] * count:
            return True
    return False


def test_detection_is_the_definition_on_random_outputs():
    rng = random.Random()
    for _ in range(3000):
        alphabet = rng.randint(1, 4)  # few tokens: repeats are frequent
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(0, 30))]
        largest, count = rng.randint(0, 6), rng.randint(0, 4)
        smallest = rng.randint(0, largest)
        expected = count >= 2 and largest > 0 and repeats_brute(tokens, largest, smallest, count)
        assert ends_in_repetition(tokens, largest, smallest, count) == expected, (tokens, largest, smallest, count)


def first_repetition(tokens: list[int], detection: dict, min_tokens: int = 0) -> int | None:
    """How many tokens an output keeps under `detection`: the first prefix (min_tokens long at least) ending in a
    repetition, or None."""
    for k in range(max(min_tokens, 1), len(tokens) + 1):
        if repeats_brute(tokens[:k], detection["max_pattern_size"], detection["min_pattern_size"],
                         detection["min_count"]):
            return k
    return None


@pytest.fixture(scope="module")
def llm(checkpoint_factory):
    return LLM(checkpoint_factory("qwen3.5"), device="cpu")


def test_the_engine_ends_an_output_where_it_starts_to_loop(llm):
    rng = random.Random()
    prompts = [[rng.randrange(300) for _ in range(rng.randint(2, 20))] for _ in range(4)]
    detection = {"max_pattern_size": rng.randint(1, 4), "min_pattern_size": 0, "min_count": rng.randint(2, 3)}
    min_tokens = rng.choice([0, 6])
    # half the rows choose among three tokens, where greedy decoding soon loops; the free rows hold stop tokens
    # back as long as the watched ones do (a row may well choose among them), so the two differ by the detection
    few = [None, None, rng.sample(range(300), 3), rng.sample(range(300), 3)]
    free = llm.generate(prompts, [SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, allowed_token_ids=a,
                                                 min_tokens=min_tokens) for a in few])
    watched = llm.generate(prompts, [SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, allowed_token_ids=a,
                                                    min_tokens=min_tokens, repetition_detection=dict(detection))
                                     for a in few])
    for f, w in zip(free, watched):
        full, kept = f.outputs[0].token_ids, w.outputs[0]
        k = first_repetition(full, detection, min_tokens)
        if k is None:
            assert kept.token_ids == full and kept.finish_reason == "length"
        else:
            assert kept.token_ids == full[:k], (detection, full)
            assert (kept.finish_reason, kept.stop_reason) == ("repetition", "repetition_detected")


def test_a_loop_of_one_token_is_caught_at_its_count(llm):
    """A logit bias that makes one token certain: the output is that token, and ends at min_count of it."""
    count = random.randint(2, 6)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logit_bias={17: 100.0},
                            repetition_detection=RepetitionDetectionParams(max_pattern_size=3, min_count=count))
    out = llm.generate([[1, 2, 3]], params)[0].outputs[0]
    assert out.token_ids == [17] * count and out.finish_reason == "repetition"


@pytest.mark.parametrize("fields, part", [
    ({"max_pattern_size": 4}, "min_count"), ({"max_pattern_size": 4, "min_count": 1}, "min_count"),
    ({"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}, "min_pattern_size"),
    ({"max_pattern_size": -1}, "max_pattern_size"), ({"max_pattern_size": 2.5, "min_count": 2}, "max_pattern_size"),
    ({"max_pattern_size": 2, "min_count": 2, "window": 9}, "takes max_pattern_size"),
])
def test_bad_detection_is_refused_by_name(fields, part):
    with pytest.raises(InvalidSamplingParamsError, match=f"repetition_detection.*{part}"):
        SamplingParams(repetition_detection=fields)


def test_detection_off_changes_nothing(llm):
    prompt = [random.randrange(300) for _ in range(9)]
    plain = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].outputs[0]
    off = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True,
                                                repetition_detection={"max_pattern_size": 0}))[0].outputs[0]
    assert off.token_ids == plain.token_ids and off.finish_reason == "length"
