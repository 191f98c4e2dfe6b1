"""Tiny random checkpoints written by transformers' own classes (the hub layout), with a small
byte-level BPE tokenizer and a ChatML template, for parity tests against transformers."""

from __future__ import annotations

import json
import os
import re

import torch

VOCAB = 320
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The capital of France is Paris. The quick brown fox jumps over the lazy dog.",
    "Hybrid models mix Gated DeltaNet layers with gated full attention layers.",
    "def main():\n    print('hello world')\n    return 0\n",
    "Numbers 0123456789 and symbols !@#$%^&*() and unicode éàü 日本語 🙂",
]


def write_tokenizer(path: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHATML
    fast.save_pretrained(path)


def _base(**overrides) -> dict:
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                rms_norm_eps=1e-6, tie_word_embeddings=False)
    base.update(overrides)
    return base


def _gdn(**overrides) -> dict:
    return _base(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                 linear_value_head_dim=16, linear_conv_kernel_dim=4, **overrides)


def _moe(shared_size: int) -> dict:
    """shared_size equal to the experts' 32 stacks the shared expert with them; any other runs it apart."""
    return dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=shared_size)


def every_expert(arch: str) -> dict:
    """Overrides that route every token to all four experts of a MoE checkpoint ({} for the others).

    For tests comparing two computations that agree to fp32 rounding only (a prefix-cache hit computes
    its tail in other passes than a miss; a graph's padded pass has other row counts): where a router's
    k-th and (k+1)-th scores nearly tie (margins of ~1e-7 turn up in about one run in 500 of the
    eight-chat prefix-cache test), rounding flips the choice and moves a logprob by up to 2e-3, where in
    float64 the same runs agree to 1e-6. With every expert chosen there is no choice to flip; top-k
    routing itself is compared with transformers in the model parity tests."""
    return {"num_experts_per_tok": 4} if arch in ("qwen3-next", "qwen3.5-moe") else {}


def build_model(arch: str, **overrides):
    import transformers as tf

    if arch == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**_base(**overrides)))
    if arch == "llama-tied":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**_base(tie_word_embeddings=True, **overrides)))
    if arch == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**_base(**overrides)))
    if arch == "qwen3-next":
        cfg = _gdn(**{**_moe(shared_size=48), "decoder_sparse_step": 1, "mlp_only_layers": [1], **overrides})
        return tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**cfg))
    if arch == "qwen3.5":
        return tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**_gdn(**overrides)))
    if arch == "qwen3.5-moe":
        return tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**_gdn(**{**_moe(shared_size=32), **overrides})))
    if arch == "qwen3.5-vl":
        text = _gdn(**overrides)
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                      temporal_patch_size=1, spatial_merge_size=1)
        config = tf.Qwen3_5Config(text_config=text, vision_config=vision)
        return tf.Qwen3_5ForConditionalGeneration(config)
    raise ValueError(arch)


ARCHITECTURES = ["llama", "llama-tied", "qwen3", "qwen3-next", "qwen3.5", "qwen3.5-moe", "qwen3.5-vl"]


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Replaces the init (zeros for the 1+w norms, ones elsewhere) with random values, so that every
    weight matters to the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)
            elif p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (0.0 if "norm" in name and _zero_centred(model) else
                                                                     (1.0 if "norm" in name else 0.0)))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)


def _zero_centred(model) -> bool:
    return model.config.model_type.startswith(("qwen3_next", "qwen3_5"))


def make_checkpoint(arch: str, path: str, seed: int = 0, **overrides) -> str:
    torch.manual_seed(seed)
    model = build_model(arch, **overrides).float().eval()
    randomize(model, seed)
    model.save_pretrained(path)
    write_tokenizer(path)
    return path


def add_think_tokens(path: str) -> tuple[int, int]:
    """Gives a checkpoint's tokenizer `<think>` and `</think>` as tokens of their own, added but not special (their
    text stays in decoded replies), as Qwen's tokenizers have them. Returns their ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.save_pretrained(path)
    start, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert end < VOCAB, "the tags must be rows of the model's embedding"
    return start, end


def add_mtp_weights(path: str, seed: int) -> None:
    """Gives a Qwen3.5 / Qwen3-Next checkpoint written by make_checkpoint random multi-token-prediction
    tensors, as the published checkpoints carry them: mtp.fc, its three norms, and mtp.layers.0.* in the
    shapes of one of the model's full-attention layers (a MoE one where the model has MoE layers), with
    `mtp_num_hidden_layers: 1` in the (text) config. Written into the checkpoint's own file, so that
    transformers meets them when it loads the checkpoint (it ignores mtp.*)."""
    from safetensors.torch import load_file, save_file

    weights = os.path.join(path, "model.safetensors")
    tensors = load_file(weights)
    g = torch.Generator().manual_seed(seed)
    hidden = next(t.shape[1] for name, t in tensors.items() if name.endswith("embed_tokens.weight"))
    shapes = {"mtp.fc.weight": (hidden, 2 * hidden)}
    shapes.update({f"mtp.{norm}.weight": (hidden,) for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")})
    prefix = _mtp_source_layer(tensors)
    shapes.update({"mtp.layers.0." + name[len(prefix):]: tuple(t.shape)
                   for name, t in tensors.items() if name.startswith(prefix)})
    for name, shape in shapes.items():  # norms zero-centred, as randomize draws them for these models
        tensors[name] = torch.randn(shape, generator=g) * (0.2 if len(shape) == 1 else 0.15)
    save_file(tensors, weights, metadata={"format": "pt"})
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.get("text_config", config)["mtp_num_hidden_layers"] = 1
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


def _mtp_source_layer(tensors: dict[str, torch.Tensor]) -> str:
    """The name prefix ('model.layers.3.') of a full-attention layer whose feed-forward block is the MTP
    layer's: MoE where any layer is."""
    attention = sorted({m.group(1) for name in tensors if (m := re.match(r"(.*layers\.\d+\.)self_attn\.", name))})
    moe = [p for p in attention if p + "mlp.gate.weight" in tensors]
    any_moe = any(name.endswith("mlp.gate.weight") for name in tensors)
    return (moe if any_moe else attention)[-1]
