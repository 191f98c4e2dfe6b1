"""`deltaserve chat` (the REPL, fed from a pipe) and `deltaserve generate` on the demo model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.server.live_server import REPO_ROOT

pytestmark = pytest.mark.timeout(400)


def test_chat_repl_and_generate():
    chat = subprocess.Popen(
        [sys.executable, "-m", "deltaserve.cli", "chat", "--max-tokens", "12", "--temperature", "0",
         "--max-model-len", "1024", "--num-kv-blocks", "64"],
        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    generate = subprocess.Popen(
        [sys.executable, "-m", "deltaserve.cli", "generate", "The capital of France is", "--max-tokens", "8",
         "--max-model-len", "1024"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # a line that is not UTF-8 (a terminal in another encoding) is read with U+FFFD, not a crash
    script = (b"What is the capital of France?\n/reset\nHi \xff\xfe there\n/reset\n/bogus\n"
              b"What is the capital of France?\n/exit\nnot read\n")
    chat_out, chat_err = (stream.decode() for stream in chat.communicate(script, timeout=360))
    gen_out, gen_err = generate.communicate(timeout=360)

    assert chat.returncode == 0 and "Traceback" not in chat_err, chat_err
    assert "> Hi \ufffd\ufffd there" in chat_out
    assert "/reset starts over" in chat_out  # the help line
    answers = [line for line in chat_out.splitlines() if "Paris" in line]
    assert len(answers) == 2, chat_out  # the same greedy answer before and after the reset
    assert "[conversation reset]" in chat_out
    assert "[unknown command /bogus" in chat_out
    assert "not read" not in chat_out  # /exit stopped reading

    assert generate.returncode == 0, gen_err
    assert "Paris" in gen_out
