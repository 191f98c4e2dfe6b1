"""Tokenizer checked against transformers' AutoTokenizer built from the same GGUF file."""

import json
import os
import random

import pytest

from deltaserve.engine.detokenizer import IncrementalDetokenizer
from deltaserve.errors import InvalidPromptError, WeightLoadError
from deltaserve.models.gguf_loader import demo_model_path
from deltaserve.sampling_params import SamplingParams
from deltaserve.tokenizer import Tokenizer

IM_START, IM_END = 1, 2  # SmolLM2's <|im_start|> (bos) and <|im_end|> (eos)

CONVERSATION = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is 12 + 30? Answer in 日本語 🙂"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_gguf(demo_model_path())


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer

    path = demo_model_path()
    return AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), local_files_only=True
    )


def _random_texts(count: int) -> list[str]:
    rng = random.Random(1234)
    alphabet = (
        "abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789   \n\t.,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`"
        "éèüñßøåçÆœ αβγδ ЖЩя 日本語中文한국어 ✓→∑∞ 🙂🚀👍🏽 \u200b\u00a0"
    )
    texts = [
        "", " ", "hello world", "  leading and trailing  ", "I 'm here . Yes ,no",
        "<|im_start|>user\nhi<|im_end|>",
    ]
    for _ in range(count):
        length = rng.randint(1, 80)
        texts.append("".join(rng.choice(alphabet) for _ in range(length)))
    return texts


def test_encode_matches_transformers(tokenizer, reference):
    for text in _random_texts(40):
        assert tokenizer.encode(text) == reference.encode(text), text
        assert tokenizer.encode(text, add_special_tokens=False) == reference.encode(
            text, add_special_tokens=False
        ), text


def test_special_token_text_encodes_to_its_id(tokenizer):
    assert tokenizer.encode("<|im_start|>user\nhi<|im_end|>")[0] == IM_START
    assert tokenizer.encode("<|im_start|>user\nhi<|im_end|>")[-1] == IM_END


def test_decode_matches_transformers_and_round_trips(tokenizer, reference):
    for text in _random_texts(40):
        ids = tokenizer.encode(text)
        # Byte-level BPE is lossless.
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    rng = random.Random(7)
    for _ in range(20):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 30))]
        ids += [IM_START, IM_END]
        for skip in (True, False):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == reference.decode(
                ids, skip_special_tokens=skip
            )


def test_special_tokens_decode_without_spaces_between_them_either_way(tokenizer, reference):
    # SamplingParams.spaces_between_special_tokens: a fast tokenizer writes no spaces there whatever it is
    # told, so the detokenizer's text is the reference's for both values. The ids end in a special token: a
    # random last token may end inside a UTF-8 character, which the detokenizer holds back and the reference
    # writes as a replacement character
    rng = random.Random()
    for _ in range(20):
        ids = [rng.choice([IM_START, IM_END, rng.randrange(tokenizer.vocab_size)]) for _ in range(rng.randint(1, 19))]
        ids.append(rng.choice([IM_START, IM_END]))
        for spaces in (True, False):
            params = SamplingParams(max_tokens=len(ids), skip_special_tokens=False,
                                    spaces_between_special_tokens=spaces)
            detok = IncrementalDetokenizer(tokenizer, [], params)
            for token in ids:
                detok.append(token)
            assert detok.visible_text(True) == reference.decode(
                ids, skip_special_tokens=False, spaces_between_special_tokens=spaces), ids


def test_decode_keeps_or_skips_special_tokens(tokenizer):
    ids = tokenizer.encode("<|im_start|>assistant\nok<|im_end|>")
    assert tokenizer.decode(ids) == "assistant\nok"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>assistant\nok<|im_end|>"


def test_tokens_and_vocab(tokenizer, reference):
    ids = tokenizer.encode("Hello world 123")
    assert tokenizer.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)
    assert tokenizer.convert_ids_to_tokens(ids)[:2] == ["Hello", "Ġworld"]
    assert tokenizer.vocab_size == len(reference) == 49152


def test_special_ids_come_from_the_gguf(tokenizer):
    # The GGUF says bos=1 <|im_start|>, eos=2 <|im_end|>; transformers' converter reports
    # the bos token as eos too, which would never stop a chat turn.
    assert tokenizer.bos_token_id == IM_START
    assert tokenizer.eos_token_ids == {IM_END}
    assert tokenizer.convert_ids_to_tokens([IM_END]) == ["<|im_end|>"]


def test_extra_eos_ids_are_added():
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer as RawTokenizer, models

    raw = RawTokenizer(models.WordLevel({"a": 0, "</s>": 1, "<eot>": 2}, unk_token="a"))
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>")
    assert Tokenizer(hf, extra_eos_ids=[2]).eos_token_ids == {1, 2}


@pytest.mark.parametrize(
    "messages,kwargs",
    [
        (CONVERSATION, {}),
        (CONVERSATION, {"add_generation_prompt": False}),
        ([{"role": "system", "content": "Be terse."}, *CONVERSATION], {}),
        ([{"role": "user", "content": "  spaces\n\nand lines  "}], {}),
    ],
)
def test_chat_template_matches_transformers(tokenizer, reference, messages, kwargs):
    text = tokenizer.apply_chat_template(messages, **kwargs)
    add_generation_prompt = kwargs.get("add_generation_prompt", True)
    assert text == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tokenizer.encode_chat(messages, **kwargs) == reference.apply_chat_template(
        messages, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt
    )
    assert text.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_chat_prompt_has_a_single_bos(tokenizer):
    ids = tokenizer.encode_chat(CONVERSATION)
    assert ids[0] == IM_START and ids[1] != IM_START
    assert tokenizer.decode(ids, skip_special_tokens=False) == tokenizer.apply_chat_template(
        CONVERSATION
    )


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        [["user", "hi"]],
        [{"content": "no role"}],
        [{"role": "user"}],
        [{"role": 3, "content": "x"}],
    ],
)
def test_malformed_messages_are_invalid_prompts(tokenizer, messages):
    with pytest.raises(InvalidPromptError):
        tokenizer.apply_chat_template(messages)


def test_message_offsets(tokenizer):
    ids = tokenizer.encode_chat(CONVERSATION)
    offsets = tokenizer.message_offsets(CONVERSATION)
    assert len(offsets) == len(CONVERSATION)
    assert offsets[0] == 0
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    # Every later message starts at its "<|im_start|>role" header.
    for offset, message in zip(offsets[1:], CONVERSATION[1:]):
        assert ids[offset] == IM_START
        header = "<|im_start|>" + message["role"] + "\n"
        assert tokenizer.decode(ids[offset:], skip_special_tokens=False).startswith(header)
    # And the tokens before it are exactly the rendered earlier turns.
    prefix = tokenizer.encode_chat(CONVERSATION[:2], add_generation_prompt=False)
    assert ids[: offsets[2]] == prefix


def test_message_offsets_when_a_turn_is_rewritten(tokenizer):
    """A template that renders earlier text differently still gives truly shared offsets."""
    messages = [{"role": "user", "content": "hello world"}, {"role": "user", "content": "b"}]
    saved = tokenizer.hf.chat_template
    # Marks the last message with "!", so rendering messages[:1] is not a prefix of the full text.
    tokenizer.hf.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% if loop.last %}!{% endif %}|{% endfor %}"
    )
    try:
        full = tokenizer.encode_chat(messages)
        offsets = tokenizer.message_offsets(messages)
    finally:
        tokenizer.hf.chat_template = saved
    assert tokenizer.decode(full) == "hello world|b!|"
    assert offsets == [0, 2]  # "hello", " world": the longest common token prefix
    assert tokenizer.decode(full[: offsets[1]]) == "hello world"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tokenizer):
    """The GGUF tokenizer saved as a Hugging Face model directory with eos ids in its configs."""
    folder = tmp_path_factory.mktemp("hf_model")
    tokenizer.hf.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"eos_token_id": IM_END}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END, 0]}))
    return folder


def test_from_pretrained_directory(hf_dir, tokenizer):
    loaded = Tokenizer.from_pretrained(hf_dir, extra_eos_ids=[5])
    for text in _random_texts(10):
        assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.apply_chat_template(CONVERSATION) == tokenizer.apply_chat_template(CONVERSATION)
    assert loaded.eos_token_ids == {IM_END, 0, 5}
    assert loaded.bos_token_id == IM_START


def test_directory_without_chat_template(hf_dir, tmp_path):
    for name in os.listdir(hf_dir):
        if name != "chat_template.jinja":
            (tmp_path / name).write_bytes((hf_dir / name).read_bytes())
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    loaded = Tokenizer.from_pretrained(tmp_path)
    assert loaded.encode("hello") == [28120]
    with pytest.raises(InvalidPromptError, match="no chat template"):
        loaded.apply_chat_template(CONVERSATION)


def test_missing_files_are_weight_load_errors(tmp_path):
    with pytest.raises(WeightLoadError, match="missing.gguf"):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")
    with pytest.raises(WeightLoadError, match="no_such_dir"):
        Tokenizer.from_pretrained(tmp_path / "no_such_dir")
