"""IncrementalDetokenizer token by token against one decode of the whole output (the demo tokenizer, and a
SentencePiece one with byte fallback, as Llama 2's and Mistral's)."""

import os
import random

import pytest

from deltaserve.engine.detokenizer import IncrementalDetokenizer
from deltaserve.models.gguf_loader import demo_model_path
from deltaserve.sampling_params import SamplingParams
from deltaserve.tokenizer import Tokenizer

PIECES = ["Hello", " world", ",", " 日本語", " 🙂", "\n", " é", "ß", " 12", " + 30", " stop", "STOP", " the end", "!"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_gguf(demo_model_path())


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 20)))


def test_text_grows_by_whole_characters_to_the_full_decode(tokenizer):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    for _ in range(30):
        prompt = tokenizer.encode(_random_text(rng), add_special_tokens=False)
        output = tokenizer.encode(_random_text(rng), add_special_tokens=False)
        detok = IncrementalDetokenizer(tokenizer, prompt, SamplingParams(max_tokens=len(output)))
        # Byte-level BPE decodes a concatenation to the concatenation of the texts.
        full = tokenizer.decode(output)
        for n, token in enumerate(output, start=1):
            assert detok.append(token) is None
            assert full.startswith(detok.text), (seed, output[:n])
            assert "\ufffd" not in detok.text, (seed, output[:n])
        assert detok.visible_text(True) == full, seed


def test_a_stop_string_cuts_the_text_at_its_first_match(tokenizer):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    for _ in range(30):
        stops = rng.sample(["STOP", " the end", "日本", "\n\n"], rng.randint(1, 2))
        include = rng.random() < 0.5
        output = tokenizer.encode(_random_text(rng) + rng.choice(stops) + _random_text(rng), add_special_tokens=False)
        params = SamplingParams(max_tokens=len(output), stop=stops, include_stop_str_in_output=include)
        detok = IncrementalDetokenizer(tokenizer, [], params)
        full = tokenizer.decode(output)
        at, stop = min((full.find(s), s) for s in stops if s in full)
        found = None
        for token in output:
            found = detok.append(token)
            assert not any(s in detok.visible_text(False) for s in stops) or found is not None, seed
            if found is not None:
                break
        assert found == stop, (seed, full, stops)
        assert detok.visible_text(False) == full[: at + len(stop) if include else at], (seed, full, stops)


def test_stop_strings_count_only_past_min_tokens(tokenizer):
    """As vLLM: a stop string in the text of the first min_tokens tokens does not count; one after them does."""
    words = [" stop", " go", " stop", " stay", " stop", " end"]
    output = [t for w in words for t in tokenizer.encode(w, add_special_tokens=False)]
    first_stop_end = len(tokenizer.encode(" stop", add_special_tokens=False))
    min_tokens = random.randint(first_stop_end, len(output) - 3)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(max_tokens=len(output), stop=["stop"],
                                                                  min_tokens=min_tokens))
    found = [(n, detok.append(t)) for n, t in enumerate(output, start=1)]
    stopped = [n for n, stop in found if stop is not None]
    text_before = tokenizer.decode(output[:min_tokens])
    later = next(n for n in range(min_tokens + 1, len(output) + 1)
                 if tokenizer.decode(output[:n]).count("stop") > text_before.count("stop"))
    assert stopped and stopped[0] == later
    plain = IncrementalDetokenizer(tokenizer, [], SamplingParams(max_tokens=len(output), stop=["stop"]))
    assert next(n for n, t in enumerate(output, start=1) if plain.append(t) is not None) == first_stop_end


def _reference_stop(tokenizer, output, stops, min_tokens):
    """Where the output stops, by definition: at the first token past min_tokens whose new text ends an
    occurrence of a stop string, that of them which starts first. (tokens read, stop string, start) or None."""
    seen = tokenizer.decode(output[:min_tokens]).rstrip("\ufffd")
    for n in range(min_tokens + 1, len(output) + 1):
        text = tokenizer.decode(output[:n]).rstrip("\ufffd")
        ends_in_new = [(text.find(s, max(0, len(seen) - len(s) + 1)), s) for s in stops]
        found = [(at, s) for at, s in ends_in_new if at >= 0]
        if found:
            at, stop = min(found)
            return n, stop, at
        seen = text
    return None


def test_stop_strings_of_several_lengths_past_min_tokens(tokenizer):
    """A short stop string wholly within the text of the first min_tokens tokens does not count, beside a longer
    one (as vLLM looks for each string from its own length before the new text)."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    for _ in range(40):
        stops = rng.sample(["a", "o", "STOP", " the end", "日本", "\n\n", "zzzzzzzz"], rng.randint(2, 3))
        output = tokenizer.encode(_random_text(rng), add_special_tokens=False)
        min_tokens = rng.randint(0, len(output))
        include = rng.random() < 0.5
        params = SamplingParams(max_tokens=len(output), stop=stops, min_tokens=min_tokens,
                                include_stop_str_in_output=include)
        detok = IncrementalDetokenizer(tokenizer, [], params)
        found = next(((n, stop) for n, t in enumerate(output, start=1) if (stop := detok.append(t))), None)
        expected = _reference_stop(tokenizer, output, stops, min_tokens)
        assert found == (expected[:2] if expected else None), (seed, tokenizer.decode(output), stops, min_tokens)
        if expected is not None:
            n, stop, at = expected
            assert detok.visible_text(False) == tokenizer.decode(output[:n])[: at + len(stop) if include else at]


@pytest.fixture(scope="module")
def byte_fallback_tokenizer():
    """A SentencePiece-style BPE (word starts marked "▁", a Llama-2 decoder) trained on ASCII alone: every other
    character is written in byte tokens (<0xE6>), whose runs the decoder reads as UTF-8 or, where a run does not
    read, as one U+FFFD a byte."""
    import json

    from tokenizers import Tokenizer as RustTokenizer, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    rust = RustTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    rust.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60)
    rust.train_from_iterator(["Hello world, the end! 12 + 30 stop STOP"] * 20, trainer)
    spec = json.loads(rust.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    hf = PreTrainedTokenizerFast(tokenizer_object=RustTokenizer.from_str(json.dumps(spec)), bos_token="<s>",
                                 eos_token="</s>", unk_token="<unk>")
    return Tokenizer(hf)


def test_a_prompt_that_ends_in_byte_tokens_leaves_the_output_whole(byte_fallback_tokenizer):
    """A text's tokens cut anywhere into a prompt and an output, the cut often among a run of byte tokens (a
    prompt of CJK or emoji, one that ends inside a character): the output's text is the whole text less the
    prompt's whole characters. A context that began inside a character read the output's bytes as U+FFFD; one
    that ended inside one lost the character the output completed."""
    tokenizer = byte_fallback_tokenizer
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    for _ in range(60):
        ids = tokenizer.encode(_random_text(rng), add_special_tokens=False)
        if len(ids) < 2:
            continue
        cut = rng.randrange(1, len(ids))
        whole = tokenizer.decode(ids)
        kept = next(end for end in range(cut, -1, -1) if not tokenizer.decode(ids[:end]).endswith("\ufffd"))
        detok = IncrementalDetokenizer(tokenizer, ids[:cut], SamplingParams(max_tokens=len(ids)))
        for token in ids[cut:]:
            detok.append(token)
            assert "\ufffd" not in detok.text, (seed, ids, cut)
        assert detok.visible_text(True) == whole[len(tokenizer.decode(ids[:kept])):], (seed, ids, cut)


def test_a_prompt_ending_inside_a_character_after_a_run_of_them_leaves_that_character_to_the_output(
        byte_fallback_tokenizer):
    """CJK characters then the first byte of a two-byte one, all byte tokens: the prompt's run of bytes reads as
    replacement characters whole (the decoder replaces every byte of a run that is not UTF-8), so its context's
    start and its last character's end are found together; the output's byte completes the character."""
    tokenizer = byte_fallback_tokenizer
    text = random.choice(["\n 日本語", "日本語", "a 語"]) + random.choice(["ß", "é", "ü"])
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, ids[:-1], SamplingParams(max_tokens=1))
    detok.append(ids[-1])
    assert detok.visible_text(True) == text[-1]
