"""SparseMoE's layout: the shared expert stacked with the routed ones when sizes match, the input GEMM's
rows aligned, hub tensors (per-expert or fused) loaded into it. Outputs against transformers are in
test_model_parity.py; these check what parity alone would not pin down."""

import pytest
import torch

from deltaserve.models.layers.moe import ROW_ALIGN, SparseMoE, input_rows
from deltaserve.models.loader import load_weights
from deltaserve.models.random_init import init_random_weights
from deltaserve.models.registry import build_model, load_hf_config
from deltaserve.models.weights import iterate_safetensors, safetensors_files


def _hub_tensors(path: str) -> dict[str, torch.Tensor]:
    return dict(iterate_safetensors(safetensors_files(path), torch.device("cpu")))


def _load(path: str, tensors: dict[str, torch.Tensor]):
    _, config = load_hf_config(path)
    model = build_model(config, torch.float32, torch.device("cpu"), 64)
    load_weights(model, tensors.items())
    return model


def _moe_layers(model) -> list[SparseMoE]:
    return [m for m in model.modules() if isinstance(m, SparseMoE)]


@pytest.mark.parametrize("experts,shared,inter,rows,padding", [
    (256, 512, 512, 264, 7),  # Qwen3.5-35B-A3B: [router | gate | 7 zero rows]
    (256, 512, 256, 1288, 7),  # [router | gate, up | gate | 7 zero rows] instead of 1281 rows
    (4, 48, 32, 104, 3),
    (128, 0, 64, 128, 0),
])
def test_input_rows_are_aligned(experts, shared, inter, rows, padding):
    layout = input_rows(experts, shared, fused=shared == inter)
    assert layout.total == rows and rows % ROW_ALIGN == 0
    assert layout.padding.stop - layout.padding.start == padding
    assert layout.router == slice(0, experts)
    if shared == inter:
        assert layout.shared_gate == slice(experts, experts + 1) and layout.shared_gate_up is None
    elif shared:
        assert layout.shared_gate_up == slice(experts, experts + 2 * shared)
        assert layout.shared_gate == slice(experts + 2 * shared, experts + 2 * shared + 1)


def test_shared_expert_is_stacked_as_the_last_expert(checkpoint_factory):
    path = checkpoint_factory("qwen3.5-moe")  # shared_expert_intermediate_size == moe_intermediate_size
    hub = _hub_tensors(path)
    moe = _moe_layers(_load(path, hub))[0]
    prefix = "model.layers.0.mlp."
    experts, inter = moe.num_experts, moe.w13.shape[1] // 2
    assert moe.fused_shared and moe.shared_down is None
    assert moe.w13.shape[0] == experts + 1 and moe.w2.shape[0] == experts + 1
    assert torch.equal(moe.w13[experts, :inter], hub[prefix + "shared_expert.gate_proj.weight"])
    assert torch.equal(moe.w13[experts, inter:], hub[prefix + "shared_expert.up_proj.weight"])
    assert torch.equal(moe.w2[experts], hub[prefix + "shared_expert.down_proj.weight"])
    assert torch.equal(moe.in_proj[experts], hub[prefix + "shared_expert_gate.weight"][0])
    assert not moe.in_proj[moe.rows.padding].any()


def test_separate_shared_expert_rows(checkpoint_factory):
    path = checkpoint_factory("qwen3-next")  # shared expert 48 wide, routed experts 32
    hub = _hub_tensors(path)
    moe = _moe_layers(_load(path, hub))[0]
    prefix = "model.layers.0.mlp."
    rows = moe.rows
    assert not moe.fused_shared and moe.w13.shape[0] == moe.num_experts
    gate_up = torch.cat([hub[prefix + "shared_expert.gate_proj.weight"], hub[prefix + "shared_expert.up_proj.weight"]])
    assert torch.equal(moe.in_proj[rows.shared_gate_up], gate_up)
    assert torch.equal(moe.in_proj[rows.shared_gate], hub[prefix + "shared_expert_gate.weight"])
    assert torch.equal(moe.shared_down, hub[prefix + "shared_expert.down_proj.weight"])
    assert not moe.in_proj[rows.padding].any()


def test_fused_expert_tensors_load_like_per_expert_ones(checkpoint_factory):
    """Hub checkpoints also store the routed experts as experts.gate_up_proj [E, 2I, H] and
    experts.down_proj [E, H, I]; the shared expert still comes apart."""
    path = checkpoint_factory("qwen3.5-moe")
    hub = _hub_tensors(path)
    per_expert = _load(path, hub)
    fused, experts = {}, per_expert.config.num_experts
    for name, tensor in hub.items():
        if ".mlp.experts." not in name:
            fused[name] = tensor
            continue
        layer = name.split(".mlp.experts.")[0]
        fused[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack([
            torch.cat([hub[f"{layer}.mlp.experts.{e}.gate_proj.weight"], hub[f"{layer}.mlp.experts.{e}.up_proj.weight"]])
            for e in range(experts)])
        fused[f"{layer}.mlp.experts.down_proj"] = torch.stack(
            [hub[f"{layer}.mlp.experts.{e}.down_proj.weight"] for e in range(experts)])
    from_fused = _load(path, fused)
    for (name, a), (_, b) in zip(per_expert.named_parameters(), from_fused.named_parameters()):
        assert torch.equal(a, b), name


def test_random_weights_leave_the_padding_zero(checkpoint_factory):
    _, config = load_hf_config(checkpoint_factory("qwen3.5-moe"))
    model = build_model(config, torch.float32, torch.device("cpu"), 64)
    init_random_weights(model)
    for moe in _moe_layers(model):
        assert not moe.in_proj[moe.rows.padding].any()
        assert moe.w13[-1].std() > 0 and moe.in_proj[moe.rows.shared_gate].std() > 0
