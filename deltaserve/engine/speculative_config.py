"""SpeculativeConfig: vLLM's `speculative_config`, as far as deltaserve drafts: the model's own multi-token-prediction
(MTP) head proposes `num_speculative_tokens` tokens after each step's last one, and the next step verifies them in
one pass (runner/speculative_step.py says how)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltaserve.errors import DeltaServeError

# vLLM's names of the MTP method: "mtp", and the model-specific ones that older releases took
MTP_METHODS = ("mtp", "qwen3_next_mtp", "qwen3_5_mtp")
# vLLM fields that ask for nothing but what deltaserve does where they are unset or at these values
NEUTRAL = {"model": (None,), "draft_tensor_parallel_size": (None, 1), "quantization": (None,)}


@dataclass(frozen=True)
class SpeculativeConfig:
    # None: vLLM's default, as many as the head predicts (the checkpoint's mtp_num_hidden_layers), which the engine
    # sets once it has read the checkpoint (model_setup.resolve_speculative)
    num_speculative_tokens: int | None
    method: str = "mtp"

    @classmethod
    def from_value(cls, value: Any) -> "SpeculativeConfig | None":
        """None, a SpeculativeConfig, or vLLM's dict ({"method": "mtp", "num_speculative_tokens": k})."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise DeltaServeError(f"speculative_config={value!r}: give a dict such as "
                                  "{\"method\": \"mtp\", \"num_speculative_tokens\": 1}")
        fields = dict(value)
        method = fields.pop("method", None)
        if method not in MTP_METHODS:
            raise DeltaServeError(f"speculative_config method={method!r}: deltaserve drafts with the model's own "
                                  f"multi-token-prediction head only (method \"mtp\")")
        count = fields.pop("num_speculative_tokens", None)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise DeltaServeError(f"speculative_config num_speculative_tokens={count!r}: must be a positive integer")
        for name, taken in NEUTRAL.items():
            if name in fields and fields.pop(name) not in taken:
                raise DeltaServeError(f"speculative_config {name}={value[name]!r}: the MTP head is the model's own "
                                      f"(leave {name} out)")
        if fields:
            raise DeltaServeError(f"speculative_config: unknown field(s) {', '.join(sorted(fields))} (deltaserve takes "
                                  "method and num_speculative_tokens)")
        return cls(num_speculative_tokens=count, method="mtp")
