"""vLLM's GET /tokenizer_info, served with --enable-tokenizer-info-endpoint alone: the tokenizer's settings, its
class and the chat template the server renders with."""

from __future__ import annotations

import uuid

import httpx
import pytest
from transformers import AutoTokenizer

from deltaserve.server.serving_tokenize import _as_json
from tests.checkpoints import make_checkpoint
from tests.server.conftest import API_KEY, serving
from tests.server.live_server import LiveServer

pytestmark = pytest.mark.timeout(300)

KEY = f"sk-{uuid.uuid4().hex[:12]}"
MARK = uuid.uuid4().hex[:8]  # in the --chat-template given, so that the answer shows that one


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return make_checkpoint("qwen3.5", str(tmp_path_factory.mktemp("tokenizer_info")))


@pytest.fixture(scope="module")
def info_server(checkpoint, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "marked.jinja"
    template.write_text(f"{{% for m in messages %}}{MARK} {{{{ m.content }}}}\n{{% endfor %}}")
    yield from serving(LiveServer(checkpoint, "--max-model-len", "512", "--enable-tokenizer-info-endpoint",
                                  "--chat-template", str(template), "--api-key", KEY))


def test_the_tokenizers_settings_class_and_chat_template(info_server, checkpoint):
    r = httpx.get(info_server.url + "/tokenizer_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    info = r.json()
    hf = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)  # as the server loads it
    assert info["tokenizer_class"] == type(hf).__name__
    assert info["chat_template"].startswith(f"{{% for m in messages %}}{MARK}")  # the server's, not the checkpoint's
    assert info["eos_token"] == "<|im_end|>"  # an added token as its text
    assert info["added_tokens_decoder"] == {str(i): t.content for i, t in hf.init_kwargs["added_tokens_decoder"].items()}
    assert "vocab_file" not in info and "merges_file" not in info
    plain = {k: v for k, v in hf.init_kwargs.items() if isinstance(v, (str, int, bool)) and k != "chat_template"}
    assert plain and all(info[k] == v for k, v in plain.items()), (plain, info)


def test_it_needs_the_key_as_tokenize_does(info_server):
    assert httpx.get(info_server.url + "/tokenizer_info", timeout=60).status_code == 401


def test_off_by_default(server):
    r = httpx.get(server.url + "/tokenizer_info", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert r.status_code == 404, r.text


def test_settings_json_has_no_form_for_are_given_as_text():
    class Token:
        content = "<s>"

    path = object()
    assert _as_json({1: Token(), "sizes": (1, 2), "path": path, "n": None}) == {
        "1": "<s>", "sizes": [1, 2], "path": str(path), "n": None}
