"""SpeculativeConfig: vLLM's `speculative_config`, as far as deltaserve drafts: the model's own multi-token-prediction
(MTP) head, or prompt lookup (method "ngram": the tokens that followed the sequence's last n-gram where it stood
before), proposes `num_speculative_tokens` tokens after each step's last one, and the next step verifies them in
one pass (runner/speculative_step.py says how)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltaserve.errors import DeltaServeError

# vLLM's names of the MTP method: "mtp", and the model-specific ones that older releases took
MTP_METHODS = ("mtp", "qwen3_next_mtp", "qwen3_5_mtp")
NGRAM_METHODS = ("ngram", "[ngram]")
NGRAM_DEFAULT = 5  # vLLM's prompt_lookup_min and _max where neither is given
# vLLM fields that ask for nothing but what deltaserve does where they are unset or at these values
NEUTRAL = {"model": (None,), "draft_tensor_parallel_size": (None, 1), "quantization": (None,)}


@dataclass(frozen=True)
class SpeculativeConfig:
    # None: vLLM's default, as many as the head predicts (the checkpoint's mtp_num_hidden_layers), which the engine
    # sets once it has read the checkpoint (model_setup.resolve_speculative)
    num_speculative_tokens: int | None
    method: str = "mtp"  # or "ngram"
    prompt_lookup_min: int | None = None  # ngram: the n-grams looked up, prompt_lookup_max down to _min tokens
    prompt_lookup_max: int | None = None

    @property
    def drafts_with_head(self) -> bool:
        return self.method == "mtp"

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
        if method not in MTP_METHODS + NGRAM_METHODS:
            raise DeltaServeError(f"speculative_config method={method!r}: deltaserve drafts with the model's own "
                                  f"multi-token-prediction head (method \"mtp\") or by prompt lookup (\"ngram\")")
        count = fields.pop("num_speculative_tokens", None)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise DeltaServeError(f"speculative_config num_speculative_tokens={count!r}: must be a positive integer")
        if method in NGRAM_METHODS:
            return cls._ngram(count, fields)
        for name, taken in NEUTRAL.items():
            if name in fields and fields.pop(name) not in taken:
                raise DeltaServeError(f"speculative_config {name}={value[name]!r}: the MTP head is the model's own "
                                      f"(leave {name} out)")
        if fields:
            raise DeltaServeError(f"speculative_config: unknown field(s) {', '.join(sorted(fields))} (deltaserve takes "
                                  "method and num_speculative_tokens)")
        return cls(num_speculative_tokens=count, method="mtp")

    @classmethod
    def _ngram(cls, count: int | None, fields: dict) -> "SpeculativeConfig":
        """vLLM's prompt lookup: num_speculative_tokens given; prompt_lookup_min and _max 5 where neither is,
        each the other where one is."""
        if count is None:
            raise DeltaServeError("speculative_config method 'ngram' needs num_speculative_tokens (the tokens a "
                                  "step drafts)")
        low, high = fields.pop("prompt_lookup_min", None), fields.pop("prompt_lookup_max", None)
        for name, n in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise DeltaServeError(f"speculative_config {name}={n!r}: must be a positive integer")
        low, high = (low or high or NGRAM_DEFAULT), (high or low or NGRAM_DEFAULT)
        if low > high:
            raise DeltaServeError(f"speculative_config prompt_lookup_min={low} must be at most "
                                  f"prompt_lookup_max={high}")
        if fields:
            raise DeltaServeError(f"speculative_config: unknown field(s) {', '.join(sorted(fields))} for method "
                                  "'ngram' (deltaserve takes num_speculative_tokens, prompt_lookup_min and _max)")
        return cls(num_speculative_tokens=count, method="ngram", prompt_lookup_min=low, prompt_lookup_max=high)
