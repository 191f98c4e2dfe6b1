"""vLLM's spellings of a command line, rewritten into the plain flags argparse reads, as vLLM's own parser
rewrites them: a flag's name may take underscores for dashes (`--max_model_len`), `-O3` is
`--optimization-level 3`, and a dict flag may be given key by key (`--default-chat-template-kwargs.enable_thinking
false`), the keys gathered into one JSON object."""

from __future__ import annotations

import json
from typing import Any


def vllm_spelling(argv: list[str]) -> list[str]:
    out: list[str] = []
    dicts: dict[str, dict] = {}  # flag -> the object its dotted keys build
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # what follows is no flag
            out += argv[i:]
            break
        if arg.startswith("-O") and not arg.startswith("--") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg.startswith("--"):
            name, has_value, value = arg.partition("=")
            flag, dot, keys = name.partition(".")
            flag = flag.replace("_", "-")
            if dot:
                if not has_value:
                    i += 1
                    value = argv[i] if i < len(argv) else ""
                _set_nested(dicts.setdefault(flag, {}), keys.split("."), _json_or_text(value))
            else:
                out.append(f"{flag}={value}" if has_value else flag)
        else:
            out.append(arg)
        i += 1
    for flag, value in dicts.items():
        out += [flag, json.dumps(value)]
    return out


def _set_nested(target: dict, keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value


def _json_or_text(value: str) -> Any:
    """A dotted key's value: JSON where it reads as JSON (false, 0.6, [1, 2]), else the text itself."""
    try:
        return json.loads(value)
    except ValueError:
        return value
