"""The multi-token-prediction head (models/mtp.py) against a reference assembled from transformers' own
classes (transformers has no MTP module: its models drop the mtp.* tensors), and its loading."""

import copy
import importlib
import logging
import re

import pytest
import torch

from deltaserve.cache.kv_pool import KVPool
from deltaserve.errors import DeltaServeError, WeightLoadError
from deltaserve.models.config import parse_model_config
from deltaserve.models.loader import load_weights
from deltaserve.models.random_init import init_random_weights
from deltaserve.models.registry import ModelSource, build_model, load_hf_config, load_model, read_architecture
from deltaserve.models.weights import iterate_safetensors, safetensors_files
from deltaserve.runner.forward_batch import ForwardBatch
from tests.checkpoints import VOCAB, add_mtp_weights, make_checkpoint

CPU = torch.device("cpu")
TOKENS = 9
# transformers' modules for each architecture: (module, decoder layer, RMSNorm, rotary embedding)
REFERENCE = {
    "qwen3.5": ("qwen3_5", "Qwen3_5DecoderLayer", "Qwen3_5RMSNorm", "Qwen3_5TextRotaryEmbedding"),
    "qwen3.5-moe": ("qwen3_5_moe", "Qwen3_5MoeDecoderLayer", "Qwen3_5MoeRMSNorm", "Qwen3_5MoeTextRotaryEmbedding"),
    "qwen3-next": ("qwen3_next", "Qwen3NextDecoderLayer", "Qwen3NextRMSNorm", "Qwen3NextRotaryEmbedding"),
}
MTP_LAYER = "mtp.layers.0."


@pytest.fixture(scope="module")
def mtp_checkpoint(tmp_path_factory):
    """Each architecture's tiny checkpoint with mtp.* tensors, written once per module."""
    made: dict[str, str] = {}

    def make(arch: str) -> str:
        if arch not in made:
            path = str(tmp_path_factory.mktemp(arch.replace(".", "_") + "_mtp"))
            make_checkpoint(arch, path, seed=1)
            add_mtp_weights(path, seed=2)
            made[arch] = path
        return made[arch]

    return make


def _load(path: str, with_mtp: bool = True):
    _, config = load_hf_config(path)
    return load_model(ModelSource(path, False), config, torch.float32, CPU, 64, with_mtp=with_mtp)


def _fresh_prefill(input_ids: torch.Tensor, pool: KVPool) -> ForwardBatch:
    """One sequence's whole prompt from position 0, its blocks 0, 1, ... in order."""
    count = input_ids.shape[0]
    blocks = -(-count // pool.block_size)
    return ForwardBatch(input_ids=input_ids, positions=torch.arange(count), query_start_loc=torch.tensor([0, count]),
                        seq_lens=torch.tensor([count]), block_tables=torch.arange(blocks)[None],
                        slot_mapping=torch.arange(count), state_slots=torch.tensor([0]), logits_indices=None,
                        is_decode=False, kv_pool=pool, state_pool=None, max_query_len=count)


def _deltaserve_mtp(model, input_ids, hidden) -> tuple[torch.Tensor, KVPool]:
    config = model.config
    pool = KVPool(config.attention_layers + [config.mtp_layer_idx], num_blocks=4, block_size=4,
                  kv_heads=config.num_kv_heads, head_dim=config.head_dim, dtype=torch.float32, device=CPU)
    with torch.no_grad():
        return model.forward_mtp(input_ids, hidden, _fresh_prefill(input_ids, pool)), pool


def _hf_layer_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mtp.layers.0.* as transformers' decoder layer names its parameters: the hub's per-expert tensors
    stacked into its experts' gate_up_proj [E, 2I, H] and down_proj [E, H, I]."""
    state = {name[len(MTP_LAYER):]: t for name, t in tensors.items() if name.startswith(MTP_LAYER)}
    experts = sorted({int(m.group(1)) for name in state if (m := re.fullmatch(r"mlp\.experts\.(\d+)\..+", name))})
    if experts:
        take = lambda e, proj: state.pop(f"mlp.experts.{e}.{proj}.weight")  # noqa: E731
        state["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([take(e, "gate_proj"), take(e, "up_proj")])
                                                         for e in experts])
        state["mlp.experts.down_proj"] = torch.stack([take(e, "down_proj") for e in experts])
    return state


def _reference_mtp(arch: str, path: str, tensors, input_ids, hidden) -> tuple[torch.Tensor, torch.Tensor]:
    """(final-norm output [T, H], logits [T, V]) of the MTP head built from transformers' classes: its
    decoder layer at index num_hidden_layers, made full attention, with the mtp.layers.0 weights; its
    RMSNorm for the three norms; the fc as a matmul; the embedding and lm_head of transformers' own load of
    the checkpoint (which must load it whole, mtp.* beside)."""
    import transformers

    ref, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    module_name, layer_name, norm_name, rotary_name = REFERENCE[arch]
    module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    config = copy.deepcopy(ref.config)
    index = config.num_hidden_layers
    config.layer_types = [*config.layer_types, "full_attention"]
    layer = getattr(module, layer_name)(config, index).eval()
    layer.load_state_dict(_hf_layer_state(tensors))  # strict: every parameter from the checkpoint

    def norm(name):
        n = getattr(module, norm_name)(config.hidden_size, eps=config.rms_norm_eps)
        n.weight.data.copy_(tensors[f"mtp.{name}.weight"])
        return n

    count = input_ids.shape[0]
    positions = torch.arange(count)[None]
    mask = torch.full((count, count), torch.finfo(torch.float32).min).triu(1)[None, None]  # causal, additive
    with torch.no_grad():
        embedded = norm("pre_fc_norm_embedding")(ref.get_input_embeddings()(input_ids))
        x = torch.cat([embedded, norm("pre_fc_norm_hidden")(hidden)], dim=-1) @ tensors["mtp.fc.weight"].T
        cos_sin = getattr(module, rotary_name)(config)(x[None], positions)
        x = layer(x[None], position_embeddings=cos_sin, attention_mask=mask, position_ids=positions)[0]
        out = norm("norm")(x)
        return out, ref.lm_head(out)


@pytest.mark.parametrize("arch", list(REFERENCE))
def test_mtp_head_matches_transformers_layers(arch, mtp_checkpoint):
    path = mtp_checkpoint(arch)
    tensors = dict(iterate_safetensors(safetensors_files(path), CPU))
    g = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, VOCAB, (TOKENS,), generator=g)
    hidden = torch.randn(TOKENS, 64, generator=g)
    model = _load(path)
    out, pool = _deltaserve_mtp(model, input_ids, hidden)
    ref_out, ref_logits = _reference_mtp(arch, path, tensors, input_ids, hidden)
    assert out.shape == (TOKENS, 64)
    torch.testing.assert_close(out, ref_out, atol=1e-4 * ref_out.abs().max().item(), rtol=0)
    assert torch.equal(model.compute_logits(out).argmax(-1), ref_logits.argmax(-1))
    # Its keys went to its own layer of the pool, the one past the model's layers, and nowhere else.
    mtp_layer = model.config.mtp_layer_idx
    assert mtp_layer == model.config.num_layers and model.mtp.layers[0].mixer.layer_idx == mtp_layer
    slots = pool.k[mtp_layer].flatten(0, 1)
    assert slots[:TOKENS].ne(0).all() and not slots[TOKENS:].any()
    assert not any(pool.k[i].any() for i in model.config.attention_layers)


def test_mtp_layer_is_moe_where_the_model_has_moe_layers(mtp_checkpoint):
    """qwen3-next's layer 1 is dense (mlp_only_layers): the MTP layer is MoE still, as the model has MoE layers."""
    model = _load(mtp_checkpoint("qwen3-next"))
    assert not model.layers[1].is_moe and model.mtp.layers[0].is_moe and model.mtp.layers[0].is_attention
    assert not _load(mtp_checkpoint("qwen3.5")).mtp.layers[0].is_moe


def test_without_mtp_the_tensors_are_skipped(mtp_checkpoint, caplog):
    path = mtp_checkpoint("qwen3.5")
    count = sum(name.startswith("mtp.") for name, _ in iterate_safetensors(safetensors_files(path)))
    with caplog.at_level(logging.INFO, logger="deltaserve.models.loader"):
        model = _load(path, with_mtp=False)
    assert model.mtp is None and not any(name.startswith("mtp") for name, _ in model.named_parameters())
    assert f"skipped {count} multi-token-prediction tensors" in caplog.text


def test_a_multimodal_checkpoint_loads_its_mtp_head(mtp_checkpoint):
    """The VL wrapper's mtp.* tensors sit at the top level, beside model.language_model.*; its
    mtp_num_hidden_layers in text_config."""
    path = mtp_checkpoint("qwen3.5-vl")
    tensors = dict(iterate_safetensors(safetensors_files(path)))
    mtp = _load(path).mtp
    assert torch.equal(mtp.fc, tensors["mtp.fc.weight"])
    assert torch.equal(mtp.layers[0].mixer.o_proj, tensors["mtp.layers.0.self_attn.o_proj.weight"])


def test_with_mtp_refuses_a_config_without_mtp_layers(mtp_checkpoint):
    path = mtp_checkpoint("qwen3.5")
    raw, _ = load_hf_config(path)
    del raw["mtp_num_hidden_layers"]
    config = parse_model_config(raw, read_architecture(raw))
    with pytest.raises(DeltaServeError, match="no multi-token-prediction layers .*mtp_num_hidden_layers"):
        load_model(ModelSource(path, False), config, torch.float32, CPU, 64, with_mtp=True)


@pytest.mark.parametrize("dropped,named", [("mtp.fc.weight", "mtp.fc"),
                                           ("mtp.layers.0.self_attn.k_proj.weight", "mtp.layers.0.mixer.qkv_proj"),
                                           ("mtp.pre_fc_norm_hidden.weight", "mtp.pre_fc_norm_hidden.weight")])
def test_a_missing_mtp_tensor_is_named(dropped, named, mtp_checkpoint):
    path = mtp_checkpoint("qwen3.5-moe")
    _, config = load_hf_config(path)
    model = build_model(config, torch.float32, CPU, 64, with_mtp=True)
    tensors = [(name, t) for name, t in iterate_safetensors(safetensors_files(path)) if name != dropped]
    with pytest.raises(WeightLoadError, match=f"lacks tensors for: {re.escape(named)}"):
        load_weights(model, tensors)


def test_only_the_first_of_several_mtp_layers_is_built(mtp_checkpoint, caplog):
    _, config = load_hf_config(mtp_checkpoint("qwen3.5"))
    config.num_mtp_layers = 2
    with caplog.at_level(logging.INFO, logger="deltaserve.models.mtp"):
        model = build_model(config, torch.float32, CPU, 64, with_mtp=True)
    assert len(model.mtp.layers) == 1 and "only the first is used" in caplog.text


def test_random_weights_fill_the_mtp_head(mtp_checkpoint):
    _, config = load_hf_config(mtp_checkpoint("qwen3.5-moe"))
    model = build_model(config, torch.float32, CPU, 64, with_mtp=True)
    init_random_weights(model)
    mtp = model.mtp
    assert not any(torch.isnan(p).any() for p in mtp.parameters())
    assert 0.01 < mtp.fc.std() < 0.03  # the matrices' std, the (1 + w) norms at 0
    assert not mtp.norm.weight.any() and not mtp.pre_fc_norm_embedding.weight.any()
    assert not mtp.layers[0].mlp.in_proj[mtp.layers[0].mlp.rows.padding].any()
