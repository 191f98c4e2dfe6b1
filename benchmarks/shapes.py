"""Model shapes for benchmarks: a config.json in the real shapes (taken from transformers' own config
classes) plus a small tokenizer, loaded with load_format="dummy" (random weights)."""

from __future__ import annotations

import json
import os

SMOLLM2_135M = dict(
    architectures=["LlamaForCausalLM"], hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, dtype="bfloat16", model_type="llama",
)


def shape_config(name: str) -> dict:
    import transformers

    if name == "qwen3.5-9b":
        cfg = transformers.Qwen3_5TextConfig().to_dict()
        cfg["architectures"] = ["Qwen3_5ForCausalLM"]
    elif name == "qwen3.5-35b-a3b":
        cfg = transformers.Qwen3_5MoeTextConfig().to_dict()
        cfg["architectures"] = ["Qwen3_5MoeForCausalLM"]
    elif name == "smollm2-135m":
        cfg = dict(SMOLLM2_135M)
    else:
        raise ValueError(f"unknown shape {name!r}")
    cfg["dtype"] = "bfloat16"
    return cfg


def write_shape(name: str, directory: str, every_id_a_word: bool = False) -> str:
    """every_id_a_word: the tokenizer names every token id of the model (a server streams their text)."""
    os.makedirs(directory, exist_ok=True)
    config = shape_config(name)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    write_word_tokenizer(directory, config["vocab_size"] if every_id_a_word else 256)
    return directory


def write_shape_with_head(name: str, directory: str) -> str:
    """write_shape, the config given one MTP layer (mtp_num_hidden_layers), as the released Qwen3.5 and Qwen3-Next
    checkpoints have: an engine that drafts with the head builds it (random weights, load_format dummy)."""
    write_shape(name, directory)
    config_file = os.path.join(directory, "config.json")
    with open(config_file) as f:
        config = json.load(f)
    config["mtp_num_hidden_layers"] = 1
    with open(config_file, "w") as f:
        json.dump(config, f)
    return directory


def write_word_tokenizer(directory: str, size: int) -> None:
    """A word-level tokenizer of `size` ids: benchmarks send token ids, and only a server asks for text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(size - 2)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(directory)


def weight_bytes(model) -> dict:
    """Bytes of parameters by kind: dense (read every step), experts (read when routed), embedding."""
    dense = experts = embed = 0
    for name, p in model.named_parameters():
        size = p.numel() * p.element_size()
        if name == "embed_tokens":
            embed += size
        elif name.endswith(("w13", "w2")):  # a stacked shared expert (the last one) is read every step
            routed = size * model.config.num_experts // p.shape[0]
            experts += routed
            dense += size - routed
        else:
            dense += size
    if model.config.tie_word_embeddings:
        dense += embed  # the tied table is read whole as the LM head
    return {"dense": dense, "experts": experts, "embedding": embed}


def allow_long_max_model_len() -> None:
    """Lets an engine run past its config's context length. The Qwen3.5 shapes keep transformers' default
    max_position_embeddings (32768, as the vLLM peer's shapes do), and the benchmarks prefill 32k-token prompts
    at max_model_len 33024 (and any length on the smaller shapes): random weights were trained on no
    positions, so the lengths past it measure the same work."""
    os.environ.setdefault("DELTASERVE_ALLOW_LONG_MAX_MODEL_LEN", "1")


def dummy_engine(name: str, with_head: bool = False, **engine_kwargs):
    """An LLMEngine with random weights in the shape `name` (its config written to a temporary folder, with one
    MTP layer where `with_head`), allowed past the config's context length."""
    import tempfile

    from deltaserve.engine.llm_engine import LLMEngine

    allow_long_max_model_len()
    write = write_shape_with_head if with_head else write_shape
    return LLMEngine.from_args(write(name, tempfile.mkdtemp()), load_format="dummy", **engine_kwargs)


def random_tokens(vocab: int, seed: int = 0):
    """tokens(n): n token ids drawn from one seeded stream."""
    import random

    rng = random.Random(seed)
    return lambda n: [rng.randrange(vocab) for _ in range(n)]

