"""Structured outputs over a vocabulary with added tokens (Qwen's <think> and </think>, not special; the chat
tokens, special): a grammar's text that spells one is written by ordinary tokens, and a Lark grammar still
names the token."""

import random
import re
import shutil
import string
import sys

import pytest

from deltaserve import LLM, SamplingParams, StructuredOutputsParams
from deltaserve.engine.grammar_vocabulary import ll_tokenizer
from tests.checkpoints import add_think_tokens

VOCAB = 320  # the tiny checkpoints' logits


@pytest.fixture(scope="module")
def tagged(checkpoint_factory, tmp_path_factory):
    """A tiny Qwen3.5 checkpoint whose tokenizer adds <think> and </think>, not special, as Qwen's does."""
    path = tmp_path_factory.mktemp("tagged")
    shutil.copytree(checkpoint_factory("qwen3.5"), path, dirs_exist_ok=True)
    start, end = add_think_tokens(str(path))
    return str(path), LLM(str(path), device="cpu"), start, end


def _hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _llguidance_own(hf):
    import llguidance.hf

    return llguidance.hf.from_tokenizer(hf, n_vocab=VOCAB, eos_token=[hf.eos_token_id])


def _random_text(rng: random.Random, pieces: list[str]) -> str:
    return "".join(rng.choice(pieces) if rng.random() < 0.3 else rng.choice(string.ascii_letters + "{}\"' \n<>/")
                   for _ in range(rng.randint(1, 40)))


def test_the_vocabulary_is_llguidances_but_an_added_tokens_text_is_ordinary_tokens(tagged):
    """Every id's bytes and mark as llguidance.hf has them, and every text's tokens but where it spells an added
    token (special or not): there the text is ordinary tokens."""
    path, _, start, end = tagged
    hf = _hf_tokenizer(path)
    ours, theirs = ll_tokenizer(hf, VOCAB, [hf.eos_token_id]), _llguidance_own(hf)
    added = {i: t.content for i, t in hf.added_tokens_decoder.items()}
    assert {added[start], added[end]} == {"<think>", "</think>"} and hf.eos_token_id in added
    assert ours.vocab_size == theirs.vocab_size == VOCAB
    assert all(ours.decode_bytes([i]) == theirs.decode_bytes([i]) for i in range(VOCAB))
    assert all(ours.is_special_token(i) == theirs.is_special_token(i) for i in range(VOCAB))
    assert ours.is_special_token(start) and ours.is_special_token(hf.eos_token_id)
    rng = random.Random()
    for _ in range(20):
        text = _random_text(rng, [" ", "\n", "</"])
        assert ours.tokenize_str(text) == theirs.tokenize_str(text), text
        spelled = _random_text(rng, list(added.values()))
        tokens = ours.tokenize_str(spelled)
        assert not set(tokens) & set(added), spelled
        assert ours.decode_bytes(tokens) == spelled.encode()


def _generate(llm, structure: StructuredOutputsParams, rng: random.Random):
    # a think block closed in the prompt (a template's with thinking off): the structure holds from the first token
    prompt = [rng.randrange(300) for _ in range(rng.randint(1, 20))] + list(llm.engine.think_tags)
    params = SamplingParams(n=3, max_tokens=40, temperature=1.0, seed=rng.randrange(2**31),
                            structured_outputs=structure)
    return llm.generate([prompt], params)[0].outputs  # three rows of one mask fill


@pytest.mark.parametrize("opening", ["<think>", "<|im_start|>"])
def test_a_regex_that_spells_an_added_token_writes_its_text(opening, tagged):
    """A regex that forces `opening` and, after a word of fixed length, "</think>": llguidance's forced bytes
    tokenized to the added token, which its matcher refused (the request failed there). Now the text is
    written in ordinary tokens, each of which llguidance's own matcher takes."""
    import llguidance

    path, llm, _, _ = tagged
    rng = random.Random()
    pattern = rf"{re.escape(opening)}[a-z]{{{rng.randint(1, 6)}}}</think>[0-9]{{1,3}}"
    reference = llguidance.LLMatcher(_llguidance_own(_hf_tokenizer(path)),
                                     llguidance.LLMatcher.grammar_from_regex(pattern))
    for sample in _generate(llm, StructuredOutputsParams(regex=pattern), rng):
        assert sample.finish_reason == "stop", sample
        assert re.fullmatch(pattern, sample.text), sample.text
        written = set(sample.token_ids) - set(llm.engine.eos_token_ids)  # a "stop" ends in the end of sequence
        assert not written & set(llm.engine.tokenizer.hf.added_tokens_decoder), sample.token_ids
        matcher = reference.deep_copy()
        assert all(matcher.consume_token(t) for t in sample.token_ids) and matcher.is_accepting()


def test_a_lark_grammar_names_the_tag_tokens(tagged):
    """In llguidance's Lark `<think>` is the token itself: the output opens with it and closes the block with
    the `</think>` token."""
    _, llm, start, end = tagged
    rng = random.Random()
    grammar = f"start: <think> /[a-z]{{1,{rng.randint(1, 6)}}}/ </think> /[0-9]{{1,2}}/"
    for sample in _generate(llm, StructuredOutputsParams(grammar=grammar), rng):
        assert sample.finish_reason == "stop", sample
        assert sample.token_ids[0] == start and sample.token_ids.count(end) == 1, sample
        assert re.fullmatch(r"<think>[a-z]+</think>[0-9]{1,2}", sample.text), sample.text


def test_without_llguidance_a_grammar_is_refused_by_its_name(checkpoint_factory, monkeypatch):
    from deltaserve.engine.grammar import GrammarCompiler
    from deltaserve.errors import InvalidSamplingParamsError

    hf = _hf_tokenizer(checkpoint_factory("qwen3.5"))
    monkeypatch.setitem(sys.modules, "llguidance", None)  # an import of it fails as where it is not installed
    monkeypatch.delitem(sys.modules, "llguidance.hf", raising=False)
    compiler = GrammarCompiler(hf, VOCAB, [hf.eos_token_id], lambda text: [])
    with pytest.raises(InvalidSamplingParamsError, match="need the llguidance package"):
        compiler.ll_tokenizer()
