"""Start-up: from an EngineConfig to a loaded model, its tokenizer, sized pools and a ModelRunner."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

import torch

from deltaserve.cache.block_allocator import BlockAllocator
from deltaserve.cache.kv_pool import KVPool
from deltaserve.cache.slot_allocator import SlotAllocator
from deltaserve.cache.snapshot_pool import SnapshotPool
from deltaserve.cache.state_pool import StatePool
from deltaserve.engine.engine_config import (
    GDN_STATE_DTYPES,
    EngineConfig,
    resolve_device,
    resolve_dtype,
    resolve_gdn_state_dtype,
)
from deltaserve.engine.sampling_defaults import load_sampling_defaults
from deltaserve.engine.speculative_config import SpeculativeConfig
from deltaserve.errors import DeltaServeError
from deltaserve.models.config import ModelConfig, parse_model_config
from deltaserve.models.registry import ModelSource, load_hf_config, load_model, read_architecture, resolve_model_source
from deltaserve.runner.cuda_graphs import DecodeGraphs
from deltaserve.runner.gdn_stash import GdnStash
from deltaserve.runner.model_runner import ModelRunner
from deltaserve.runner.mtp_drafter import MtpDrafter
from deltaserve.runner.mtp_graphs import MtpGraphs
from deltaserve.runner.ngram_drafter import NgramDrafter
from deltaserve.runner.prefill_graphs import PrefillGraphs, prefill_graph_rows
from deltaserve.runner.sampler import Sampler
from deltaserve.runner.speculative_step import SpeculativeStep
from deltaserve.runner.step_buffers import StepBuffers
from deltaserve.runner.verify_graphs import VerifyGraphs
from deltaserve.tokenizer import Tokenizer, read_chat_template

log = logging.getLogger(__name__)

GiB = 1 << 30
GPU_ACTIVATION_RESERVE = 8 * GiB  # logits, activations of a full prefill chunk, graph pools
SNAPSHOT_MEMORY_SHARE = 0.1  # of the cache memory, for prefix-cache GDN state snapshots by default
# Either lets max_model_len pass the checkpoint's context length, with a warning; vLLM's name too, since
# deltaserve runs vLLM's command lines and scripts as they are.
ALLOW_LONG_MAX_MODEL_LEN_VARS = ("DELTASERVE_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ALLOW_LONG_MAX_MODEL_LEN")


@dataclass
class LoadedModel:
    name: str
    model_config: ModelConfig
    tokenizer: Tokenizer
    max_model_len: int
    blocks: BlockAllocator
    slots: SlotAllocator | None
    snapshots: SnapshotPool | None  # GDN models with prefix caching on
    runner: ModelRunner
    device: torch.device
    dtype: torch.dtype
    sampling_defaults: dict  # SamplingParams fields the checkpoint recommends (engine/sampling_defaults.py)


def load_engine_model(config: EngineConfig) -> LoadedModel:
    started = time.perf_counter()
    source = resolve_model_source(config.model, config.revision, config.download_dir, config.hf_token)
    sampling_defaults = load_sampling_defaults(config.generation_config, source.path, source.is_gguf,
                                               config.override_generation_config)
    device = resolve_device(config.device)
    model_config, tokenizer, gguf_tensors = _read_checkpoint(source)
    check_checkpoint_format(config, source, model_config)
    check_max_model_len(config.max_model_len, model_config)  # before the model is built
    if config.chat_template is not None:
        tokenizer.set_chat_template(read_chat_template(config.chat_template))
    tokenizer.chat_content_format = config.chat_template_content_format
    dtype = resolve_dtype(config.dtype, model_config.dtype, device)
    max_positions = config.max_model_len or model_context_length(model_config)
    check_speculative(config.speculative_config, model_config, source)
    speculative = config.speculative_config = resolve_speculative(config.speculative_config, model_config)
    with_head = speculative is not None and speculative.drafts_with_head
    model = load_model(source, model_config, dtype, device, max_positions, gguf_tensors,
                       dummy=config.load_format == "dummy", with_mtp=with_head)
    kv_pool, blocks, state_pool, slots, snapshots, verify_states, stash = _build_pools(config, model_config, model,
                                                                                      dtype, device)
    capacity = blocks.num_blocks * config.block_size
    max_model_len = config.max_model_len or min(model_context_length(model_config), capacity)
    if max_model_len > capacity:
        setting = _pool_setting(config, device)
        raise DeltaServeError(
            f"max_model_len={max_model_len} needs {max_model_len} KV slots but the pool holds {capacity} "
            f"({blocks.num_blocks} blocks of {config.block_size}, as {setting}={getattr(config, setting)} sizes "
            f"it); raise {setting} or lower max_model_len")
    graphs = prefill_graphs = verify_graphs = mtp_graphs = None
    if speculative is not None and device.type == "cuda" and not config.enforce_eager:
        rows = config.max_num_seqs * (speculative.num_speculative_tokens + 1)
        prompt_rows = prefill_graph_rows(config.max_num_batched_tokens)
        buffers = StepBuffers(config.max_num_seqs, -(-max_model_len // config.block_size), kv_pool, state_pool, device,
                              max_prefill_rows=max(rows, prompt_rows))
        verify_graphs = VerifyGraphs(model, buffers, speculative.num_speculative_tokens, config.max_num_seqs,
                                     verify_states, config.block_size, stash)
        pool = torch.cuda.graph_pool_handle()
        verify_graphs.capture(pool)
        if with_head:
            mtp_graphs = MtpGraphs(model, buffers, verify_graphs, speculative.num_speculative_tokens,
                                   config.block_size)
            mtp_graphs.capture(pool)
        else:  # prompt lookup's steps without drafts to verify run as a plain engine's (SpeculativeStep)
            graphs = DecodeGraphs(model, buffers, config.max_num_seqs, model_config.vocab_size)
            graphs.capture(pool)
        # a prompt chunk, alone or beside the verify graph's sequences (the MTP head reads every row's state)
        prefill_graphs = PrefillGraphs(model, buffers, snapshots, prompt_rows, every_row=with_head)
        prefill_graphs.capture(pool)
    elif device.type == "cuda" and not config.enforce_eager:
        buffers = StepBuffers(config.max_num_seqs, -(-max_model_len // config.block_size), kv_pool, state_pool, device,
                              max_prefill_rows=prefill_graph_rows(config.max_num_batched_tokens))
        pool = torch.cuda.graph_pool_handle()
        graphs = DecodeGraphs(model, buffers, config.max_num_seqs, model_config.vocab_size)
        graphs.capture(pool)
        prefill_graphs = PrefillGraphs(model, buffers, snapshots)
        prefill_graphs.capture(pool)
    sampler = Sampler(model_config.vocab_size, device, config.seed, config.logprobs_mode)
    runner = ModelRunner(model, kv_pool, state_pool, config.block_size, device, sampler, graphs, snapshots,
                         prefill_graphs)
    if speculative is not None:
        runner.speculative = SpeculativeStep(_drafter(speculative, model, config, runner, mtp_graphs), verify_states,
                                             speculative.num_speculative_tokens, verify_graphs, stash)
    log.info("loaded %s (%s) on %s in %s in %.1f s: %d KV blocks, %d state slots (%s), %d snapshot slots, "
             "max_model_len %d%s", source.name, model_config.architecture, device, dtype, time.perf_counter() - started,
             blocks.num_blocks, slots.num_slots if slots else 0, state_pool.h_all.dtype if state_pool else "-",
             snapshots.num_slots if snapshots else 0, max_model_len, _verify_rows_held(verify_states, stash))
    return LoadedModel(source.name, model_config, tokenizer, max_model_len, blocks, slots, snapshots, runner, device,
                       dtype, sampling_defaults)


def model_context_length(mc: ModelConfig) -> int:
    """The context an unset max_model_len takes: what the config allows, or max_position_embeddings (4096
    where the config names no length)."""
    return mc.context_length or mc.max_position_embeddings


def check_max_model_len(max_model_len: int | None, mc: ModelConfig) -> None:
    """Refuses a max_model_len past the context the checkpoint's config allows, unless an environment variable
    allows it: the model was never trained on those positions, and what it computes there cannot be trusted."""
    if max_model_len is None or mc.context_length is None or max_model_len <= mc.context_length:
        return
    what = (f"max_model_len={max_model_len} is more than the model's context length of {mc.context_length} "
            f"({mc.context_length_from} in its config)")
    allowed_by = long_max_model_len_allowed_by()
    if allowed_by is None:
        raise DeltaServeError(
            f"{what}: the model never saw positions past {mc.context_length}. Lower max_model_len (or leave it "
            f"unset for the model's), or set DELTASERVE_ALLOW_LONG_MAX_MODEL_LEN=1 (vLLM's "
            f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 too) to run past it anyway")
    log.warning("%s; running past it as %s=1 allows: the model never saw positions past %d, and its outputs "
                "there may be garbage", what, allowed_by, mc.context_length)


def long_max_model_len_allowed_by() -> str | None:
    """The environment variable that allows a max_model_len past the model's context (1 or true), if any."""
    for name in ALLOW_LONG_MAX_MODEL_LEN_VARS:
        if os.environ.get(name, "0").strip().lower() in ("1", "true"):
            return name
    return None


def check_speculative(speculative: SpeculativeConfig | None, mc: ModelConfig, source: ModelSource) -> None:
    """Speculative decoding with the MTP method drafts with the checkpoint's own head: it must have one."""
    if speculative is not None and speculative.drafts_with_head and (source.is_gguf or not mc.num_mtp_layers):
        raise DeltaServeError(f"speculative_config method 'mtp' drafts with the model's multi-token-prediction head, "
                              f"and {source.name} has none (its config names no mtp_num_hidden_layers; Qwen3.5 and "
                              f"Qwen3-Next checkpoints carry one)")


def _drafter(speculative: SpeculativeConfig, model, config: EngineConfig, runner: ModelRunner, mtp_graphs):
    """What proposes a step's drafts: the model's MTP head (its drafting graphs where captured), or prompt lookup."""
    if not speculative.drafts_with_head:
        return NgramDrafter(speculative.num_speculative_tokens, speculative.prompt_lookup_min,
                            speculative.prompt_lookup_max)
    drafter = MtpDrafter(model, speculative.num_speculative_tokens, config.block_size, runner.to_forward_batch)
    drafter.graphs = mtp_graphs
    return drafter


def resolve_speculative(speculative: SpeculativeConfig | None, mc: ModelConfig) -> SpeculativeConfig | None:
    """num_speculative_tokens left out: as many as the head predicts, its layer count (vLLM's n_predict)."""
    if speculative is None or speculative.num_speculative_tokens is not None:
        return speculative
    return dataclasses.replace(speculative, num_speculative_tokens=mc.num_mtp_layers)


def check_checkpoint_format(config: EngineConfig, source: ModelSource, model_config: ModelConfig) -> None:
    """vLLM's load_format and quantization, where they name a format: the checkpoint must be of it."""
    found = "gguf" if source.is_gguf else "safetensors"
    if config.load_format in ("safetensors", "gguf") and config.load_format != found:
        raise DeltaServeError(f"load_format={config.load_format!r}, but {source.path!r} is a {found} checkpoint "
                              f"(give {found!r} or 'auto')")
    if config.quantization == "fp8" and not model_config.fp8_weights:
        raise DeltaServeError(f"quantization='fp8': deltaserve quantizes no weights itself, and {source.path!r} "
                              "is no FP8 checkpoint (its config.json names no fp8 quantization_config)")


def _verify_rows_held(verify_states: SnapshotPool | None, stash: GdnStash | None) -> str:
    """What a drafting GDN model's verify rows hold, for the load line: their conv-only slots and the stash."""
    if verify_states is None or stash is None:
        return ""
    return f", {verify_states.num_verify_slots} conv-only verify slots and a stash of their GDN inputs ({_bytes(stash.nbytes)})"


def _read_checkpoint(source: ModelSource):
    if source.is_gguf:
        from deltaserve.models.gguf_loader import load_gguf

        checkpoint = load_gguf(source.path)
        raw = checkpoint.config
        model_config = parse_model_config(raw, read_architecture(raw))
        return model_config, Tokenizer.from_gguf(source.path), checkpoint.tensors
    raw, model_config = load_hf_config(source.path)
    return model_config, Tokenizer.from_pretrained(source.path), None


def _build_pools(config: EngineConfig, mc: ModelConfig, model, dtype: torch.dtype, device: torch.device):
    """The KV pool (with the MTP head's layer where the engine drafts), the GDN state slots, and the snapshot
    pool, whose conv-only slots past the prefix cache's take the conv states of a speculative step's verify rows
    (verify_states: that pool, or None without GDN layers or drafts), and the stash of those rows' GDN inputs
    (None likewise)."""
    _check_budget_fits_gpu(config, device)
    state_pool, slots, snapshots, stash, spent = _gdn_pools(config, mc, model, dtype, device)
    if not config.enable_prefix_caching:
        snapshots, verify_pool = None, snapshots  # the pool holds verify slots alone
    else:
        verify_pool = snapshots
    layers = kv_layers(config, mc)
    num_blocks = config.num_kv_blocks or _default_num_blocks(config, mc, dtype, device, spent, len(layers))
    kv_pool = KVPool(layers, num_blocks, config.block_size, mc.num_kv_heads, mc.head_dim, dtype, device)
    verify_states = verify_pool if config.speculative_config is not None else None
    return kv_pool, BlockAllocator(num_blocks), state_pool, slots, snapshots, verify_states, stash


def kv_layers(config: EngineConfig, mc: ModelConfig) -> list[int]:
    """The layer ids the KV pool holds: the attention layers', and the MTP head's (num_layers) where it drafts."""
    speculative = config.speculative_config
    return mc.attention_layers + ([mc.num_layers] if speculative is not None and speculative.drafts_with_head else [])


def _gdn_pools(config: EngineConfig, mc: ModelConfig, model, dtype: torch.dtype, device: torch.device):
    """A GDN model's state slots (one for each running sequence) and, with prefix caching, its snapshot slots;
    with drafts, conv-only verify slots and the stash of the verify rows' inputs; and the bytes they take, which
    kv_cache_memory_bytes counts (vLLM's mamba state pages share its KV budget). Built before the KV pool, which
    is sized to what they leave."""
    if not mc.gdn_layers:
        return None, None, None, None, 0
    gdn_shape = (mc.gdn_conv_dim, mc.linear_conv_kernel_dim, mc.linear_num_value_heads, mc.linear_key_head_dim,
                 mc.linear_value_head_dim)
    state_dtype = GDN_STATE_DTYPES[resolve_gdn_state_dtype(config.gdn_state_dtype, mc.mamba_ssm_dtype)]
    per_slot = StatePool.bytes_per_slot(len(mc.gdn_layers), *gdn_shape, dtype, state_dtype)
    # each pool holds one slot more than it hands out: a graph's padded rows write there
    spent = _charge(config, 0, per_slot * (config.max_num_seqs + 1),
                    f"the GDN state of max_num_seqs={config.max_num_seqs} sequences", "max_num_seqs")
    state_pool = StatePool(mc.gdn_layers, config.max_num_seqs, *gdn_shape, dtype, device, state_dtype)
    snapshots = stash = None
    speculative = config.speculative_config
    # a speculative step keeps the conv state after each verify row but the last (k slots a sequence) and every
    # verify row's GDN inputs, through which its verdicts commit the recurrent states (GdnStash)
    verify_slots = config.max_num_seqs * speculative.num_speculative_tokens if speculative is not None else 0
    if verify_slots:
        rows = config.max_num_seqs * (speculative.num_speculative_tokens + 1)
        conv_slot = StatePool.conv_bytes_per_slot(len(mc.gdn_layers), mc.gdn_conv_dim, mc.linear_conv_kernel_dim,
                                                  dtype)
        stash_bytes = GdnStash.bytes_for(len(mc.gdn_layers), rows, mc.linear_num_key_heads * mc.linear_key_head_dim,
                                         mc.gdn_value_dim, mc.linear_num_value_heads, dtype)
        spent = _charge(config, spent, conv_slot * verify_slots + stash_bytes,
                        f"the conv states of {verify_slots} verify rows (max_num_seqs x num_speculative_tokens) and "
                        f"the GDN inputs of {rows}", "max_num_seqs")
        stash = GdnStash.of(model, mc.gdn_layers, rows)
    if config.enable_prefix_caching or verify_slots:
        num_snapshots = config.ssm_snapshot_slots if config.enable_prefix_caching else 0
        if num_snapshots is None:
            share = max(0.0, _cache_budget(config, device, spent) * SNAPSHOT_MEMORY_SHARE)
            num_snapshots = int(min(share // per_slot, 4 * config.max_num_seqs))
        spent = _charge(config, spent, per_slot * (num_snapshots + 1),
                        f"{num_snapshots} GDN state snapshots", "ssm_snapshot_slots")
        snapshots = SnapshotPool(mc.gdn_layers, num_snapshots, *gdn_shape, dtype, device, state_dtype, verify_slots)
    return state_pool, SlotAllocator(config.max_num_seqs), snapshots, stash, spent


def _charge(config: EngineConfig, spent: int, nbytes: int, what: str, knob: str) -> int:
    """spent + nbytes: the bytes of kv_cache_memory_bytes that the GDN pools take once this one is built; a pool
    that would run past it is refused by name, with the setting to lower."""
    budget = config.kv_cache_memory_bytes
    if budget is not None and spent + nbytes > budget:
        left = f"the {_bytes(budget - spent)} it leaves after the GDN state" if spent else "all of it"
        raise DeltaServeError(f"kv_cache_memory_bytes={budget} is too small for {what} ({_bytes(nbytes)}, more "
                              f"than {left}); raise kv_cache_memory_bytes or lower {knob}")
    return spent + nbytes


def _check_budget_fits_gpu(config: EngineConfig, device: torch.device) -> None:
    """A kv_cache_memory_bytes past the GPU's free memory is refused by name, where torch would fail to allocate."""
    budget = config.kv_cache_memory_bytes
    if budget is None or device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    if budget > free:
        raise DeltaServeError(f"kv_cache_memory_bytes={budget} ({_bytes(budget)}) is more than the GPU has free "
                              f"after loading the model ({_bytes(free)}); lower it")


def _cache_budget(config: EngineConfig, device: torch.device, spent: int = 0) -> float:
    """Bytes the caches may still take: kv_cache_memory_bytes less the `spent` bytes the GDN pools took of it;
    else what the GPU has left beside the activations (the pools built so far are out of its free memory
    already), or the CPU setting."""
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes - spent
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free * config.gpu_memory_utilization - GPU_ACTIVATION_RESERVE
    return config.cpu_kv_cache_gib * GiB


def _default_num_blocks(config: EngineConfig, mc: ModelConfig, dtype: torch.dtype, device: torch.device,
                        spent: int = 0, num_layers: int | None = None) -> int:
    num_layers = len(mc.attention_layers) if num_layers is None else num_layers
    per_block = KVPool.bytes_per_block(num_layers, config.block_size, mc.num_kv_heads, mc.head_dim, dtype)
    budget = _cache_budget(config, device, spent)
    wanted = -(-(config.max_model_len or model_context_length(mc)) // config.block_size) * config.max_num_seqs
    blocks = int(min(budget // max(per_block, 1), wanted))
    if blocks < 1 and config.kv_cache_memory_bytes is not None:
        after = f" after the GDN state and snapshots ({_bytes(spent)})" if spent else ""
        raise DeltaServeError(f"kv_cache_memory_bytes={config.kv_cache_memory_bytes} leaves {_bytes(budget)} for the "
                              f"KV cache{after}, less than one block of {config.block_size} tokens "
                              f"({_bytes(per_block)}); raise kv_cache_memory_bytes")
    if blocks < 1:
        setting = _pool_setting(config, device)
        raise DeltaServeError(f"no memory is left for the KV cache after loading the model ({setting}="
                              f"{getattr(config, setting)}); raise {setting}")
    return blocks


def _pool_setting(config: EngineConfig, device: torch.device) -> str:
    """The setting that sized the KV pool, as an error asking to raise it names it."""
    if config.num_kv_blocks:
        return "num_kv_blocks"
    if config.kv_cache_memory_bytes is not None:
        return "kv_cache_memory_bytes"
    return "gpu_memory_utilization" if device.type == "cuda" else "cpu_kv_cache_gib"


def _bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{int(n)} bytes"
