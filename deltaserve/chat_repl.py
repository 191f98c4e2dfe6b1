"""`deltaserve chat`: a terminal chat that streams the reply and keeps the conversation.

The engine runs in-process; each turn renders the whole conversation through the chat
template and hands the engine the message boundaries, so the prefix cache serves the earlier
turns and only the new tail is prefilled.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any, TextIO

from deltaserve.chat_content_format import messages_for_template, resolve_content_format
from deltaserve.engine.async_engine import engine_max_model_len
from deltaserve.errors import DeltaServeError

HELP = "Type a message and press Enter. /reset starts over, /exit (or Ctrl+D) quits."


class ChatSession:
    def __init__(self, engine: Any, params: Any, system: str | None = None, out: TextIO = sys.stdout):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine_max_model_len(engine)
        self.max_tokens_cap = getattr(engine, "max_tokens_cap", None)  # the generation config's max_new_tokens
        # how the template takes a message's content (--chat-template-content-format, else read from it), as
        # LLM.chat and the server give it
        self.content_format = resolve_content_format(self.tokenizer.chat_content_format,
                                                     self.tokenizer.hf.chat_template)
        self.params = params
        self.system = system
        self.out = out
        self.messages: list[dict] = []
        self._ids = itertools.count()
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, text: str) -> str | None:
        """Send one user message, stream the answer to `out`, and return it (None if refused)."""
        messages = self.messages + [{"role": "user", "content": text}]
        conversation = messages_for_template(messages, self.content_format)
        prompt = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            self.out.write(f"[the conversation is {len(prompt_ids)} tokens, the context holds {self.max_model_len}: "
                           "/reset to start over]\n")
            return None
        longest = min(self.params.max_tokens or room, room, self.max_tokens_cap or room)
        params = _with_max_tokens(self.params, longest)
        try:
            capture_points = list(self.tokenizer.message_offsets(conversation))
        except Exception:
            capture_points = None
        request_id = f"chat-{next(self._ids)}"
        kwargs = {"prompt_text": prompt}
        if capture_points is not None:
            kwargs["capture_points"] = capture_points
        self.engine.add_request(request_id, prompt_ids, params, **kwargs)
        sent = 0
        answer = ""
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.request_id != request_id:
                        continue
                    answer = output.outputs[0].text
                    self.out.write(answer[sent:])
                    self.out.flush()
                    sent = len(answer)
        except KeyboardInterrupt:
            self.engine.abort(request_id)
            self.out.write(" [interrupted]\n")
            return None
        self.out.write("\n")
        self.messages = messages + [{"role": "assistant", "content": answer}]
        return answer


def reply_params(engine: Any, args: argparse.Namespace) -> Any:
    """A reply's sampling: the flags given, over the generation config's values (--generation-config,
    --override-generation-config: the checkpoint's own by default), over the API's defaults, as a server's
    request that leaves them out samples. Without --max-tokens a reply may fill the context."""
    from dataclasses import replace

    given = {name: getattr(args, name) for name in ("max_tokens", "temperature", "top_p")
             if getattr(args, name, None) is not None}
    return replace(engine.default_sampling_params(), **given)


def _with_max_tokens(params: Any, max_tokens: int) -> Any:
    from dataclasses import replace

    return replace(params, max_tokens=max_tokens)


def repl(session: ChatSession, lines: TextIO = sys.stdin, interactive: bool = True) -> None:
    """Read messages until /exit or end of input; a terminal gets line editing via input()."""
    out = session.out
    out.write(HELP + "\n")
    while True:
        try:
            line = input("> ") + "\n" if interactive else lines.readline()
        except EOFError:
            line = ""
        if not line:
            out.write("\n")
            return
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            return
        if text == "/reset":
            session.reset()
            out.write("[conversation reset]\n")
            continue
        if text.startswith("/"):
            out.write(f"[unknown command {text.split()[0]}; {HELP}]\n")
            continue
        if not interactive:
            out.write(f"> {text}\n")
        try:
            session.reply(text)
        except DeltaServeError as exc:
            out.write(f"[error: {exc}]\n")


def run(args: argparse.Namespace) -> int:
    from deltaserve.engine.llm_engine import LLMEngine
    from deltaserve.server.launcher import engine_kwargs

    print(f"deltaserve: loading {args.model or 'the demo model'} ...", file=sys.stderr, flush=True)
    engine = LLMEngine.from_args(args.model, **engine_kwargs(args))
    params = reply_params(engine, args)
    session = ChatSession(engine, params, system=args.system)
    interactive = sys.stdin.isatty()
    if hasattr(sys.stdin, "reconfigure"):  # a line that is not UTF-8 reads with U+FFFD where it breaks, not a crash
        sys.stdin.reconfigure(errors="replace")
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    repl(session, sys.stdin, interactive=interactive)
    return 0
