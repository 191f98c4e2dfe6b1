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
    --no- twin where the command has one), a list of several gives the flag its items, a mapping its JSON,
    anything else (a list of one included) its text."""
    import yaml

    if os.path.splitext(path)[1] not in (".yaml", ".yml"):
        raise DeltaServeError(f"--config {path}: a config file is YAML, named .yaml or .yml")
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except OSError as exc:
        raise DeltaServeError(f"--config {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise DeltaServeError(f"--config {path}: not UTF-8 text (byte {exc.start} cannot be read)") from None
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
        elif isinstance(value, list) and len(value) != 1:
            words += [_flag(key), *map(str, value)] if value else []
        elif value is not None:
            words += [_with_value(key, value[0] if isinstance(value, list) else value)]
    return words


def _with_value(key: str, value) -> str:
    """The flag and its value as one word, `--api-key=-secret`: apart, argparse reads a value that starts with
    "-" as a flag of its own."""
    return f"{_flag(key)}={json.dumps(value) if isinstance(value, dict) else value}"


def _check_key(path: str, key: str, value, command: argparse.ArgumentParser) -> None:
    """A key must be one of the command's flags by its whole name (argparse would take a prefix of one), a switch
    takes a YAML boolean (any other value would be a word of its own: MODEL), and a list is for a flag that takes
    several values (its items would otherwise run on into MODEL) and holds no item that reads as a flag."""
    action = command._option_string_actions.get(_flag(key))
    if action is None:
        raise DeltaServeError(f"--config {path}: {key} is not a flag of this command (see its --help)")
    if action.dest == "config":
        raise DeltaServeError(f"--config {path}: {key}: a config file cannot name another")
    if action.nargs == 0 and not isinstance(value, bool) and value is not None:
        raise DeltaServeError(f"--config {path}: {key} is a switch: give it true or false, not {value!r}")
    if isinstance(value, list) and action.nargs in (None, "?", 0):
        raise DeltaServeError(f"--config {path}: {key} takes one value, not a list")
    if isinstance(value, list) and len(value) > 1:
        for item in map(str, value):
            if item.startswith("-"):
                raise DeltaServeError(f"--config {path}: {key}: {item!r} starts with '-', which argparse reads "
                                      "as a flag in a list of several values")


def _named_option(command: argparse.ArgumentParser, word: str) -> argparse.Action | None:
    """The option a word of the line names, by one of its spellings or by a prefix argparse takes for it."""
    if not word.startswith("-"):
        return None
    flag = word.split("=", 1)[0]
    options = command._option_string_actions
    if flag in options:
        return options[flag]
    taken = [action for name, action in options.items() if flag.startswith("--") and name.startswith(flag)]
    return taken[0] if len(taken) == 1 else None  # several: argparse refuses the prefix as ambiguous


def _given_on_the_line(command: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the options that argv names."""
    return {action.dest for action in (_named_option(command, word) for word in argv) if action is not None}


def _parse_the_line(parser: argparse.ArgumentParser, commands: dict[str, argparse.ArgumentParser],
                    argv: list[str]) -> argparse.Namespace:
    """argv as argparse reads it, `--config FILE` (or a prefix of it argparse takes) in args.config; a command
    without --config is refused by name where the line gives it one."""
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command not in commands and any(
            len(flag) > 2 and "--config".startswith(flag) for flag in (word.split("=", 1)[0] for word in unknown)):
        raise DeltaServeError(f"--config is for serve and chat, not {args.command}")
    return parser.parse_args(argv) if unknown else args  # argparse's own error for the unknown words


def _parse_the_file(command: argparse.ArgumentParser, path: str) -> argparse.Namespace:
    """The file's flags parsed on their own (so that no list of the file runs into the line's MODEL); argparse's
    error (its usage, the message, exit 2) names the file."""
    report = command.error
    command.error = lambda message: report(f"--config {path}: {message}")  # the instance's, for this parse only
    try:
        return command.parse_args(config_file_args(path, command))
    finally:
        del command.error


def parse_with_config_file(parser: argparse.ArgumentParser, commands: dict[str, argparse.ArgumentParser],
                           argv: list[str]) -> argparse.Namespace:
    """The command line parsed as vLLM reads it with `--config FILE`: each option the line does not give takes the
    file's value, and the line's own win. argparse finds --config on the line (as --config=FILE, or a prefix such
    as --conf), so that any spelling it takes reads the file."""
    args = _parse_the_line(parser, commands, argv)
    path = getattr(args, "config", None)
    if path is None:
        return args
    command = commands[args.command]
    if sum(_named_option(command, word) is command._option_string_actions["--config"] for word in argv) > 1:
        raise DeltaServeError("--config is given more than once: give one config file")  # argparse keeps the last
    from_file = _parse_the_file(command, path)
    given = _given_on_the_line(command, argv)
    if args.model is not None:  # MODEL on the line: the file's model, either way, gives way
        given |= {"model", "model_option"}
    for dest, value in vars(from_file).items():
        if dest not in given:
            setattr(args, dest, value)
    return args
