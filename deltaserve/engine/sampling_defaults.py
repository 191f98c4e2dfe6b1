"""The sampling defaults a checkpoint recommends in its generation_config.json, applied as vLLM applies them.

A request (or an `LLM.generate` call without SamplingParams) that leaves a field unset takes the checkpoint's
value instead of the API's: Qwen3.5's files ask for temperature 0.6, top-k 20 and top-p 0.95, where the API
would sample at temperature 1 from the whole vocabulary. `generation_config="auto"` (the default) reads the
model's own file, a directory reads the file there, and "vllm" keeps the API's defaults; vLLM's
`override_generation_config` sets values of the same names over whichever of those. `do_sample` is not
read: vLLM ignores it too, and a request asks for greedy decoding with temperature 0.
"""

from __future__ import annotations

import json
import os
from typing import Any

from deltaserve.errors import DeltaServeError, InvalidSamplingParamsError
from deltaserve.sampling_params import SamplingParams

# generation_config.json's names -> SamplingParams' names
FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
          "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
BUILT_IN = "vllm"  # the API's own defaults, as vLLM names the choice


def load_sampling_defaults(setting: str, model_path: str, is_gguf: bool,
                           override: dict[str, Any] | None = None) -> dict[str, Any]:
    """SamplingParams fields -> the checkpoint's values (empty where there are none, or with "vllm"), with
    `override` (vLLM's override_generation_config: generation_config.json's names and values) over them."""
    defaults = _file_defaults(setting, model_path, is_gguf)
    if not override:
        return defaults
    if not isinstance(override, dict):
        raise DeltaServeError(f"override_generation_config={override!r}: must be a JSON object")
    unread = sorted(set(override) - set(FIELDS))
    if unread:
        raise DeltaServeError(f"override_generation_config: {', '.join(unread)} is not read (give "
                              f"{', '.join(FIELDS)})")
    return _checked({**defaults, **_as_sampling_fields(override)}, "override_generation_config")


def _file_defaults(setting: str, model_path: str, is_gguf: bool) -> dict[str, Any]:
    if setting == BUILT_IN:
        return {}
    if setting == "auto":
        if is_gguf:
            return {}
        path = os.path.join(model_path, "generation_config.json")
        if not os.path.exists(path):
            return {}
    else:
        path = os.path.join(setting, "generation_config.json")
        if not os.path.isfile(path):
            raise DeltaServeError(f"generation_config={setting!r}: give 'auto', '{BUILT_IN}' or a directory holding a "
                                  "generation_config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as exc:
        raise DeltaServeError(f"{path} could not be read as JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise DeltaServeError(f"{path} is not a JSON object")
    return _checked(_as_sampling_fields(raw), path)


def _as_sampling_fields(values: dict[str, Any]) -> dict[str, Any]:
    fields = {ours: values[theirs] for theirs, ours in FIELDS.items() if values.get(theirs) is not None}
    if fields.get("top_k") == 0:  # transformers' "no top-k"
        fields["top_k"] = -1
    return fields


def _checked(defaults: dict[str, Any], source: str) -> dict[str, Any]:
    try:
        SamplingParams(**defaults)
    except InvalidSamplingParamsError as exc:
        raise DeltaServeError(f"{source}: {exc}") from exc
    return defaults


def max_tokens_cap(setting: str, defaults: dict[str, Any], override: dict[str, Any] | None) -> int | None:
    """The most tokens a served request may generate, whatever it asks (vLLM's override_max_tokens): the
    max_new_tokens of a generation_config.json named by its directory, or of override_generation_config; the
    checkpoint's own file ("auto") only fills in a request that asks no limit."""
    if setting not in ("auto", BUILT_IN):
        return defaults.get("max_tokens")
    return (override or {}).get("max_new_tokens")


def describe(defaults: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in defaults.items())
