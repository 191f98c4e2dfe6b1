"""Sampling math over a batch of logits rows, one set of parameters per row (vLLM's meanings)."""

import torch


def apply_penalties(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """logits [B, V] fp32; prompt_mask [B, V] bool (token in the prompt); output_counts [B, V] (times
    generated); per-row penalties [B]. Repetition covers prompt and output; the others output only."""
    seen = prompt_mask | (output_counts > 0)
    rep = repetition[:, None].expand_as(logits)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    logits = logits - frequency[:, None] * output_counts
    return logits - presence[:, None] * (output_counts > 0).to(logits.dtype)


def mask_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Sets to -inf what top-k (0 = off), top-p (1 = off) and min-p (0 = off) exclude, per row."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    drop = rank >= k
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(-1) - probs  # mass of strictly better tokens
    drop |= (before >= top_p[:, None]) & (rank > 0)
    drop |= probs < min_p[:, None] * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample_from_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    noise: torch.Tensor,
    *,
    any_mask: bool,
) -> torch.Tensor:
    """Greedy where temperature == 0; elsewhere a draw from the temperature-scaled, top-k/top-p/min-p
    masked distribution by the exponential race, argmax p / e with e ~ Exp(1) given per row in
    `noise` [B, V]. `any_mask`: whether some row has top-k, top-p or min-p on, which the caller knows from
    its parameters on the host; read from the tensors, it would wait for the GPU to finish the logits and
    stop the next step from being planned meanwhile."""
    greedy = logits.argmax(-1)
    temp = torch.where(temperature > 0, temperature, 1.0)[:, None]
    scaled = logits / temp
    if any_mask:
        scaled = mask_logits(scaled, top_k, top_p, min_p)
    probs = torch.softmax(scaled, dim=-1)
    drawn = (probs / noise).argmax(-1)
    return torch.where(temperature > 0, drawn, greedy)
