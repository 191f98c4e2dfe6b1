"""vLLM's --config FILE: a YAML file of serve's (or chat's) flags under the command line, whose own flags win."""

import json
import random

import pytest

from deltaserve.cli import _build_parser, _parse
from deltaserve.errors import DeltaServeError
from deltaserve.server.launcher import engine_kwargs


def _write(tmp_path, text: str, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_files_flags_apply_under_the_lines(tmp_path):
    port, seqs = random.randint(1024, 60000), random.randint(1, 64)
    path = _write(tmp_path, f"""
model: org/from-file
port: 9
max_num_seqs: {seqs}
max-model-len: 32K
served-model-name: [first, second]
enforce-eager: true
enable-prefix-caching: false
async-scheduling: false
override-generation-config: {{temperature: 0.5}}
allowed-origins: '["https://ui.example"]'
gdn-state-dtype: bfloat16
""")
    args = _parse(["serve", "--config", path, "--port", str(port), "--gdn-state-dtype", "float32"])
    assert args.model == "org/from-file" and args.port == port  # the line's port, not the file's
    assert args.served_model_name == ["first", "second"] and args.allowed_origins == ["https://ui.example"]
    assert engine_kwargs(args) == {"max_num_seqs": seqs, "max_model_len": 32768, "enforce_eager": True,
                                   "enable_prefix_caching": False, "override_generation_config": {"temperature": 0.5},
                                   "gdn_state_dtype": "float32", "async_scheduling": False}  # false: its --no- twin
    # a list of the file never runs into the line's MODEL, which wins over the file's; --config=FILE is the same
    args = _parse(["serve", f"--config={path}", "my/model"])
    assert args.model == "my/model" and args.served_model_name == ["first", "second"] and args.port == 9
    chat = _parse(["chat", "--config", _write(tmp_path, "max-tokens: 7\nsystem: Be brief.\n", "chat.yml")])
    assert (chat.max_tokens, chat.system, chat.model) == (7, "Be brief.", None)


def test_the_line_alone_is_unchanged():
    line = ["serve", "m", "--max-num-seqs", "3", "--api-key", "a", "b"]
    assert vars(_parse(line)) == {**vars(_build_parser().parse_args(line)), "model": "m"}
    assert _parse(["serve", "--model", "x/y"]).model == "x/y"
    with pytest.raises(DeltaServeError, match="given twice"):
        _parse(["serve", "a/b", "--model", "x/y"])


def test_wrong_files_are_named(tmp_path):
    cases = [(str(tmp_path / "missing.yaml"), "No such file"),
             (_write(tmp_path, "port: 1", "config.json"), "is YAML, named .yaml or .yml"),
             (_write(tmp_path, "- port\n- 1\n", "list.yaml"), "must map flag names to values"),
             (_write(tmp_path, "port: [1, \n", "broken.yml"), "not YAML")]
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("served-model-name: café\n".encode("latin-1"))
    cases.append((str(latin1), "not UTF-8 text"))
    for path, why in cases:
        with pytest.raises(DeltaServeError, match=why):
            _parse(["serve", "--config", path])
    with pytest.raises(DeltaServeError, match="more than once"):
        _parse(["serve", "--config", cases[0][0], "--config", cases[0][0]])
    with pytest.raises(DeltaServeError, match="not generate"):
        _parse(["generate", "hi", "--config", _write(tmp_path, "port: 1")])
    # a key is a flag by its whole name: argparse's prefixes (max-model for max-model-len) are for the line
    for key in ("no-such-flag", "max-model", "max_model"):
        with pytest.raises(DeltaServeError, match=f"{key} is not a flag of this command"):
            _parse(["serve", "--config", _write(tmp_path, json.dumps({key: 512}))])
    # a list is for a flag of several values: one of a single value ran on into MODEL
    for key, value in (("port", [1, 2]), ("tool-call-parser", ["hermes", "qwen3_coder"])):
        with pytest.raises(DeltaServeError, match=f"{key} takes one value, not a list"):
            _parse(["serve", "--config", _write(tmp_path, json.dumps({key: value}))])


def test_a_prefix_of_config_reads_the_file(tmp_path, capsys):
    """argparse takes --conf for --config, as vLLM's parser does: the file it names is read, never skipped."""
    path = _write(tmp_path, "port: 8771\nmax-num-seqs: 3\n")
    for line in (["serve", "--conf", path], ["serve", f"--conf={path}", "m"], ["serve", "--con", path]):
        args = _parse(line)
        assert (args.port, args.max_num_seqs) == (8771, 3)
    with pytest.raises(DeltaServeError, match="more than once"):
        _parse(["serve", "--config", path, "--conf", path])
    with pytest.raises(SystemExit):  # argparse's error for a value it refuses, naming the file
        _parse(["serve", "--conf", bad := _write(tmp_path, "port: 8771\nmax-model-len: 1.5K\n", "bad.yaml")])
    assert f"--config {bad}: argument --max-model-len: '1.5K'" in capsys.readouterr().err


def test_a_switch_takes_true_or_false(tmp_path):
    for key, value in (("enforce-eager", "yes"), ("enable-prefix-caching", 0), ("no-warm-up", "false")):
        path = _write(tmp_path, json.dumps({key: value}))
        with pytest.raises(DeltaServeError, match=f"--config {path}: {key} is a switch: give it true or false"):
            _parse(["serve", "--config", path])


def test_a_value_starting_with_a_dash_stays_a_value(tmp_path):
    path = _write(tmp_path, 'api-key: "-secret"\nserved-model-name: ["-name"]\nmax-logprobs: -1\n'
                            'chat-template: "--{{ x }}"\n')
    args = _parse(["serve", "--config", path, "m"])
    assert (args.api_key, args.served_model_name, args.max_logprobs, args.chat_template, args.model) == (
        ["-secret"], ["-name"], -1, "--{{ x }}", "m")
    # several values of a list go as separate words, where argparse reads one starting with "-" as a flag
    path = _write(tmp_path, 'api-key: [a, "-b"]\n')
    with pytest.raises(DeltaServeError, match=f"--config {path}: api-key: '-b' starts with '-'"):
        _parse(["serve", "--config", path])


def test_a_config_file_names_no_other(tmp_path):
    path = _write(tmp_path, f"config: {_write(tmp_path, 'port: 1', 'other.yaml')}\n")
    with pytest.raises(DeltaServeError, match="a config file cannot name another"):
        _parse(["serve", "--config", path])
