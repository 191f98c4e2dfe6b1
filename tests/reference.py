"""Helpers that run transformers (the reference of record) and deltaserve side by side."""

from __future__ import annotations

import torch


def load_reference(path: str):
    """transformers' model of a checkpoint, in float64 (its experts in eager loops: grouped_mm takes no
    float64). In fp32 its own rounding reaches the tolerance the tests hold deltaserve's fp32 to: on one
    qwen3-next prompt of 81 tokens its logits lay 1.35e-4 from float64's where deltaserve's lay 2.2e-5."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64,
                                                             experts_implementation="eager").eval()


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' own greedy generate: (new tokens, logits [steps, vocab] fp32)."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                         pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), torch.stack(out.logits)[:, 0].float()


class LogitsRecorder:
    """Wraps a deltaserve model's compute_logits to keep every row it returns, per request order."""

    def __init__(self, model):
        self.rows: list[torch.Tensor] = []
        self._inner = model.compute_logits
        model.compute_logits = self

    def __call__(self, hidden):
        logits = self._inner(hidden)
        self.rows.append(logits.detach().clone())
        return logits
