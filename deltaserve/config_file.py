"""vLLM's `--config FILE`: a YAML file of a command's flags, each key a flag's name and its value the flag's,
under the command line: an option the line names keeps the line's value."""

from __future__ import annotations

import argparse
import json
import os

from deltaserve.errors import DeltaServeError


def _flag(key: str) -> str:
    """A YAML key as its flag: vLLM's files write `max-model-len` or `max_model_len`."""
    return "--" + key.replace("_", "-")


def config_file_args(path: str, command: argparse.ArgumentParser | None = None) -> list[str]:
    """The file's flags as command-line words: true is the flag alone and false leaves it out (or gives its
    --no- twin where the command has one), a list gives the flag its items, a mapping its JSON, anything else
    its text."""
    import yaml

    if os.path.splitext(path)[1] not in (".yaml", ".yml"):
        raise DeltaServeError(f"--config {path}: a config file is YAML, named .yaml or .yml")
    try:
        with open(path) as f:
            config = yaml.safe_load(f)
    except OSError as exc:
        raise DeltaServeError(f"--config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise DeltaServeError(f"--config {path}: not YAML ({exc})") from None
    if config is None:
        return []
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise DeltaServeError(f"--config {path}: must map flag names to values (such as `port: 8000`)")
    words = []
    for key, value in config.items():
        if command is not None:
            _check_key(path, key, value, command)
        if isinstance(value, bool):
            negative = "--no-" + _flag(key)[2:]
            if value or (command is not None and negative in command._option_string_actions):
                words += [_flag(key) if value else negative]
        elif isinstance(value, list):
            words += [_flag(key), *map(str, value)] if value else []
        elif isinstance(value, dict):
            words += [_flag(key), json.dumps(value)]
        elif value is not None:
            words += [_flag(key), str(value)]
    return words


def _check_key(path: str, key: str, value, command: argparse.ArgumentParser) -> None:
    """A key must be one of the command's flags by its whole name (argparse would take a prefix of one), and a
    list is for a flag that takes several values (its items would otherwise run on into MODEL)."""
    action = command._option_string_actions.get(_flag(key))
    if action is None:
        raise DeltaServeError(f"--config {path}: {key} is not a flag of this command (see its --help)")
    if isinstance(value, list) and action.nargs in (None, "?", 0):
        raise DeltaServeError(f"--config {path}: {key} takes one value, not a list")


def _without_config(argv: list[str]) -> tuple[list[str], str | None]:
    """argv less its `--config FILE` (or `--config=FILE`), and FILE."""
    found = [i for i, word in enumerate(argv) if word == "--config" or word.startswith("--config=")]
    if not found:
        return argv, None
    if len(found) > 1:
        raise DeltaServeError("--config is given more than once: give one config file")
    i = found[0]
    if argv[i] != "--config":
        return argv[:i] + argv[i + 1:], argv[i].split("=", 1)[1]
    if i + 1 == len(argv):
        raise DeltaServeError("--config needs a file")
    return argv[:i] + argv[i + 2:], argv[i + 1]


def _given_on_the_line(command: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the options that argv names (by any of their spellings or a prefix argparse takes)."""
    given = set()
    for word in argv:
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            action = command._option_string_actions.get(flag) or next(
                (a for name, a in command._option_string_actions.items() if name.startswith(flag) and
                 flag.startswith("--")), None)
            if action is not None:
                given.add(action.dest)
    return given


def parse_with_config_file(parser: argparse.ArgumentParser, commands: dict[str, argparse.ArgumentParser],
                           argv: list[str]) -> argparse.Namespace:
    """The command line parsed as vLLM reads it with `--config FILE`: each option the line does not give takes the
    file's value, and the line's own win. The file's flags are parsed on their own, so that no list of the file
    runs into the line's words."""
    argv, path = _without_config(argv)
    args = parser.parse_args(argv)
    if path is None:
        return args
    command = commands.get(args.command)
    if command is None:
        raise DeltaServeError(f"--config is for serve and chat, not {args.command}")
    from_file = parser.parse_args([args.command] + config_file_args(path, command))
    given = _given_on_the_line(command, argv)
    if args.model is not None:  # MODEL on the line: the file's model, either way, gives way
        given |= {"model", "model_option"}
    for dest, value in vars(from_file).items():
        if dest not in given:
            setattr(args, dest, value)
    return args
