"""Tokenizer: encode/decode and chat-template rendering over a Hugging Face fast tokenizer.

Loads from a Hugging Face model directory or from the tokenizer stored in a GGUF file's
metadata. Chat prompts are rendered by the checkpoint's own jinja template, through
transformers, so the text is byte-identical to `apply_chat_template(tokenize=False)`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence

import jinja2
import tokenizers

from deltaserve.errors import InvalidPromptError, WeightLoadError


class Tokenizer:
    def __init__(self, hf_tokenizer, extra_eos_ids: Iterable[int] = ()):
        self.hf = hf_tokenizer
        # The Rust tokenizer under a fast tokenizer: decoding through it directly skips
        # transformers' per-call argument handling, most of a short decode's cost (the
        # incremental detokenizer decodes twice per generated token).
        backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        self._rust = backend if isinstance(backend, tokenizers.Tokenizer) else None
        eos = {hf_tokenizer.eos_token_id} if hf_tokenizer.eos_token_id is not None else set()
        self.eos_token_ids: set[int] = eos | {int(i) for i in extra_eos_ids}
        self.chat_content_format = "auto"  # how chats give the template a message's content (chat_content_format)

    # ----- construction -----

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike, extra_eos_ids: Iterable[int] = ()):
        """Load from an HF directory; eos ids in config.json and generation_config.json count."""
        from transformers import AutoTokenizer

        model_dir = os.fspath(model_dir)
        if not os.path.isdir(model_dir):
            raise WeightLoadError(f"{model_dir}: model directory not found")
        try:
            hf = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except Exception as exc:  # a missing file, or a config transformers' own checks refuse (a field's kind)
            raise WeightLoadError(f"{model_dir}: cannot load the tokenizer: {exc}") from exc
        config_eos = _eos_ids_in_json(os.path.join(model_dir, "config.json"))
        generation_eos = _eos_ids_in_json(os.path.join(model_dir, "generation_config.json"))
        return cls(hf, [*config_eos, *generation_eos, *extra_eos_ids])

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, extra_eos_ids: Iterable[int] = ()):
        """Load the tokenizer and chat template stored in a GGUF file's metadata, offline."""
        # PreTrainedTokenizerFast reads the GGUF once; AutoTokenizer would read it twice.
        from transformers import PreTrainedTokenizerFast

        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            raise WeightLoadError(f"{path}: GGUF file not found")
        # transformers prefers a tokenizer.json or tokenizer_config.json beside the file to the file's own
        # metadata: read from a folder that holds the file alone, under the name ending in .gguf it looks for
        with tempfile.TemporaryDirectory() as alone:
            os.symlink(path, os.path.join(alone, "model.gguf"))
            try:
                hf = PreTrainedTokenizerFast.from_pretrained(alone, gguf_file="model.gguf", local_files_only=True)
            except Exception as exc:  # parsing untrusted bytes; any failure means a bad file
                raise WeightLoadError(f"{path}: cannot read the GGUF tokenizer: {exc}") from exc
        _restore_gguf_special_tokens(hf)
        return cls(hf, extra_eos_ids)

    # ----- as a Hugging Face tokenizer (what vLLM's LLM.get_tokenizer() gives scripts) -----

    def __getattr__(self, name: str):
        """What this wrapper does not define, the Hugging Face tokenizer's own (eos_token_id, batch_decode,
        convert_tokens_to_ids, ...)."""
        if name.startswith("__") or name in ("hf", "_rust"):
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __call__(self, text, **kwargs):
        return self.hf(text, **kwargs)

    def __len__(self) -> int:
        return self.vocab_size

    # ----- tokens -----

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can emit, added tokens included."""
        return len(self.hf)

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if LONE_SURROGATE.search(text):
            raise InvalidPromptError("the text holds a lone UTF-16 surrogate (half of a pair), which is not text")
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # No space clean-up: it drops spaces before punctuation, so decode(encode(s)) != s.
        if self._rust is not None:
            return self._rust.decode(ids if isinstance(ids, list) else list(ids), skip_special_tokens=skip_special_tokens)
        return self.hf.decode(
            list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return self.hf.convert_ids_to_tokens(list(ids))

    # ----- chat -----

    def set_chat_template(self, template: str) -> None:
        """Replaces the checkpoint's chat template (or gives one to a checkpoint without)."""
        try:
            jinja2.Environment().parse(template)
        except jinja2.TemplateSyntaxError as exc:
            raise WeightLoadError(f"the chat template does not parse: {exc}") from exc
        self.hf.chat_template = template

    def apply_chat_template(
        self, messages, *, tools=None, add_generation_prompt: bool = True, tokenize: bool = False, **template_kwargs
    ) -> str | list[int]:
        """Render a conversation with the checkpoint's chat template (or the chat_template among the options):
        its text, or with tokenize=True (a Hugging Face tokenizer's spelling, as vLLM scripts pass it) its ids."""
        if tokenize:
            return self.encode_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                    **template_kwargs)
        if not (template_kwargs.get("chat_template") or self.hf.chat_template):
            raise InvalidPromptError(
                "this model has no chat template; send a plain text prompt instead of messages"
            )
        _check_messages(messages)
        try:
            return self.hf.apply_chat_template(
                list(messages),
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **template_kwargs,
            )
        except (jinja2.TemplateError, TypeError, KeyError, ValueError) as exc:
            # Templates reject bad conversations with raise_exception(...) -> TemplateError.
            raise InvalidPromptError(f"the chat template rejected the messages: {exc}") from exc

    def encode_chat(
        self, messages, *, tools=None, add_generation_prompt: bool = True, **template_kwargs
    ) -> list[int]:
        """Token ids of the rendered chat prompt."""
        text = self.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
        # The template already writes any BOS it wants; transformers' tokenize=True path
        # encodes with add_special_tokens=False for the same reason.
        return self.encode(text, add_special_tokens=False)

    def message_offsets(
        self, messages, *, tools=None, add_generation_prompt: bool = True, full: Sequence[int] | None = None,
        **template_kwargs
    ) -> list[int]:
        """For each message, the token index where it starts in `full` (by default
        `encode_chat(messages)` with the same options).

        Message i starts where the rendering of messages[:i] ends. When that rendering is
        not a token prefix of the full prompt (templates that rewrite earlier turns, or a
        BPE merge across the boundary) the longest common token prefix is used, so every
        offset marks tokens truly shared with the full prompt.
        """
        if full is None:
            full = self.encode_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                    **template_kwargs)
        offsets = [0]
        for i in range(1, len(messages)):
            try:
                prefix = self.encode_chat(messages[:i], tools=tools, add_generation_prompt=False, **template_kwargs)
            except InvalidPromptError:  # some templates refuse partial conversations
                prefix = full[: offsets[-1]]
            offsets.append(_common_prefix_len(prefix, full))
        # Keep them monotone by lowering earlier ones: a lower offset is still shared.
        for i in range(len(offsets) - 2, -1, -1):
            offsets[i] = min(offsets[i], offsets[i + 1])
        return offsets


# half of a UTF-16 surrogate pair: Python text (and JSON's escapes) may hold one, no tokenizer encodes it
LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# apply_chat_template's own arguments that say what it returns and of what: as template variables (a request's
# chat_template_kwargs) they would collide with the call ("got multiple values") or turn its text into ids or a dict
RENDERING_ARGUMENTS = ("messages", "conversation", "tokenize", "return_dict", "return_tensors",
                       "return_assistant_tokens_mask")


def _check_messages(messages) -> None:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidPromptError("messages must be a non-empty list of {role, content} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidPromptError(f"messages[{i}] is not an object with a role")
        if not isinstance(message.get("role"), str):
            raise InvalidPromptError(f"messages[{i}] lacks a string 'role'")


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _restore_gguf_special_tokens(hf) -> None:
    """Set bos/eos tokens to the ids the GGUF names.

    transformers' GGUF llama converter sets both bos_token and eos_token to the token at
    the bos id, while the ids it read from the file survive in init_kwargs.
    """
    for name in ("bos", "eos"):
        token_id = hf.init_kwargs.get(f"{name}_token_id")
        if token_id is not None:
            setattr(hf, f"{name}_token", hf.convert_ids_to_tokens(int(token_id)))


def _eos_ids_in_json(path: str) -> list[int]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        eos = json.load(f).get("eos_token_id")
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]


def read_chat_template(value: str) -> str:
    """--chat-template: a file's text, or the template itself where it is written inline (as vLLM reads it)."""
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                return f.read()
        except UnicodeDecodeError as exc:
            raise WeightLoadError(f"chat template {value}: not UTF-8 text (byte {exc.start} cannot be read)") from None
    if "{" not in value:  # neither a file nor a template: most likely a mistyped path
        raise WeightLoadError(f"chat template {value!r}: no such file, and not a template")
    return value
