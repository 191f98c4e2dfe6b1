"""Sampling math over a batch of logits rows, one set of parameters per row (vLLM's meanings)."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowTokens:
    """Each row's tokens, concatenated: row b's are tokens[offsets[b] : offsets[b + 1]] (tokens int32,
    offsets [B + 1] int32, on the logits' device). `longest`: the most tokens a row has, known on the host
    (it sizes a kernel's grid without reading the offsets back)."""

    tokens: torch.Tensor
    offsets: torch.Tensor
    longest: int

    def flat_entries(self, vocab: int) -> torch.Tensor:
        """row * vocab + token (int64) for each token, rows in order."""
        rows = torch.arange(len(self.offsets) - 1, device=self.tokens.device)
        rows = torch.repeat_interleave(rows, self.offsets.diff(), output_size=len(self.tokens))
        return rows * vocab + self.tokens


def apply_penalties(logits: torch.Tensor, prompt: RowTokens, output: RowTokens, repetition: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """A penalised copy of logits [B, V] fp32: `prompt`, each row's prompt tokens (a repeat changes
    nothing); `output`, each row's generated tokens (repeats count); per-row penalties [B]. The sampler
    sends lists, which the Triton kernel reads as they are; here they become the definition's [B, V] mask
    and counts (160 MB at 128 rows of a 248k vocabulary)."""
    rows, vocab = logits.shape
    prompt_mask = torch.zeros(rows * vocab, dtype=torch.bool, device=logits.device)
    prompt_mask[prompt.flat_entries(vocab)] = True
    entries = output.flat_entries(vocab)
    counts = torch.zeros(rows * vocab, dtype=torch.float32, device=logits.device)
    counts.index_add_(0, entries, torch.ones(len(entries), device=logits.device))
    return penalise(logits, prompt_mask.view(rows, vocab), counts.view(rows, vocab), repetition, frequency,
                    presence)


def penalise(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """The definition, vLLM's: logits [B, V] fp32; prompt_mask [B, V] bool (token in the prompt);
    output_counts [B, V] (times generated); per-row penalties [B]. Repetition covers prompt and output
    (divides a positive logit, multiplies the others); frequency and presence cover the output only."""
    seen = prompt_mask | (output_counts > 0)
    rep = repetition[:, None].expand_as(logits)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    logits = logits - frequency[:, None] * output_counts
    return logits - presence[:, None] * (output_counts > 0).to(logits.dtype)


@dataclass(frozen=True)
class MaskPlan:
    """What the host knows of a batch's masks from its sampled rows' parameters (reading the tensors would
    wait for the logits): `top_k`, their largest top-k (0 where none has top-k on); `all_top_k`, whether
    every one has top-k on (only then may a row's mask look at its best `top_k` tokens alone); `nucleus`,
    whether some row without top-k has top-p or min-p on; `greedy_rows`, whether the batch has greedy rows
    beside them (their argmax reads whole rows, where sampled rows with top-k read their candidates); `min_p`,
    whether some row without top-k may have min-p on (where none has, top-p's share is of the whole row and
    the nucleus floors need not sum what min-p keeps)."""

    top_k: int = 0
    all_top_k: bool = False
    nucleus: bool = False
    greedy_rows: bool = True
    min_p: bool = True

    @property
    def masks(self) -> bool:
        return self.top_k > 0 or self.nucleus

    @property
    def candidates(self) -> int | None:
        """How many of a row's best tokens mask_logits looks at (None: the whole row)."""
        return self.top_k if self.all_top_k else None


def mask_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                candidates: int | None = None) -> torch.Tensor:
    """Sets to -inf what top-k (0 = off), top-p (1 = off) and min-p (0 = off) exclude, per row.
    `candidates`: where every row keeps at most that many tokens by its top-k (the caller knows from its
    parameters), only the best `candidates` of a row are sorted (torch.topk) rather than all of them; a
    row whose top-k is off then keeps at most its best `candidates` (a greedy row's argmax stays)."""
    vocab = logits.shape[-1]
    if candidates is not None and candidates < vocab:
        sorted_logits, order = logits.topk(candidates, dim=-1)
    else:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
    masked = mask_sorted(sorted_logits, top_k, top_p, min_p, vocab)
    return torch.full_like(logits, float("-inf")).scatter_(-1, order, masked)


def mask_sorted(sorted_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                vocab: int) -> torch.Tensor:
    """mask_logits over each row's best tokens [B, n] in descending order (n <= vocab, the row's length):
    what the masks exclude set to -inf. In vLLM's order: top-k and min-p (a token's probability against the
    best one's), then top-p, whose mass is over the tokens those two keep."""
    rank = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    drop = rank >= k
    # In float64: over a vocabulary of 248k tokens, float32's softmax sum and running sum drift by more than
    # one token's mass where the nucleus ends.
    logits = sorted_logits.double()
    probs = torch.softmax(logits.masked_fill(drop, float("-inf")), dim=-1)
    drop |= probs < min_p[:, None] * probs[:, :1]
    probs = torch.softmax(logits.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(-1) - probs  # mass of strictly better tokens
    drop |= (before >= top_p[:, None].double()) & (rank > 0) & (top_p[:, None] < 1)  # 1 is off: rounding must not cut
    return sorted_logits.masked_fill(drop, float("-inf"))


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool [rows, vocab]: the bits of an int32 bitmask, bit t % 32 of word t // 32 standing for token t."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], bitmask.shape[1] * 32)[:, :vocab].bool()


def token_bits(mask_row: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """bool [len(tokens)]: allowed_tokens' bits of one bitmask row (int32 [words]) for these tokens alone."""
    return ((mask_row[tokens >> 5] >> (tokens & 31).to(torch.int32)) & 1).bool()


def without_tokens(mask_row: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """A copy of one bitmask row (int32 [words]) with these tokens' bits cleared."""
    out = mask_row.clone()
    one = torch.ones((), dtype=torch.int32)
    for token in set(tokens):
        out[token >> 5] &= ~(one << (token & 31))
    return out


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, mask_rows: torch.Tensor) -> torch.Tensor:
    """A copy of logits [B, V] where a row whose mask_rows entry (int [B]) is r >= 0 keeps the tokens that
    bitmask[r] (int32 [R, ceil(V / 32)]) allows and holds -inf elsewhere; rows of -1 are copied as they are."""
    if not len(bitmask):
        return logits.clone()
    allowed = allowed_tokens(bitmask, logits.shape[-1])[mask_rows.clamp(min=0).long()] | (mask_rows < 0)[:, None]
    return logits.masked_fill(~allowed, float("-inf"))


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """int32 keys that order as the float32 values x, -inf lowest (the float's bits, the magnitude's
    reversed where the sign is set): a floor on them is a floor on the values."""
    bits = x.contiguous().view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


# The race's noise: token i of a row with seed s draws u = ((h >> 41) + 1/2) / 2^23 (exact in float32) from
# the 64-bit hash h = mix(s + (i + 1) * GOLDEN) (splitmix64's finalizer), and its Gumbel variable
# -log(-log u). Integer arithmetic, so the Triton kernel and this reference draw the same u on any device.
GOLDEN = 0x9E3779B97F4A7C15
MIX_A = 0xBF58476D1CE4E5B9
MIX_B = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that holds it (torch has no uint64 arithmetic)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 tensors holding uint64 bits (>> on int64 copies the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniforms(seeds: torch.Tensor, vocab: int) -> torch.Tensor:
    """u [B, vocab] in (0, 1), float32: the race's draws for rows of 63-bit seeds [B] (int64)."""
    index = torch.arange(1, vocab + 1, dtype=torch.int64, device=seeds.device)
    x = seeds.to(torch.int64)[:, None] + index[None, :] * _signed(GOLDEN)  # wraps modulo 2^64, as uint64 would
    x = x ^ _shift_right(x, 30)
    x = x * _signed(MIX_A)
    x = x ^ _shift_right(x, 27)
    x = x * _signed(MIX_B)
    x = x ^ _shift_right(x, 31)
    return (_shift_right(x, 41).to(torch.float32) + 0.5) * 2.0**-23


def race(scaled: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """The token [B] (int64) a draw from softmax(scaled) picks: argmax of scaled + Gumbel noise (the
    exponential race argmax p / e with e = -log u, in logs). Masked tokens (-inf) never win."""
    gumbel = -torch.log(-torch.log(uniforms(seeds, scaled.shape[-1])))
    return (scaled + gumbel).argmax(-1)


def sample_from_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    *,
    mask: MaskPlan,
) -> torch.Tensor:
    """Greedy where temperature == 0; elsewhere a draw from the temperature-scaled, top-k/top-p/min-p
    masked distribution by the race (race()), each row's noise from its seed in `seeds` [B] (int64).
    `mask`: what the masks need, known on the host (MaskPlan)."""
    greedy = logits.argmax(-1)
    inverse = torch.where(temperature > 0, 1.0 / temperature, 1.0)[:, None]
    scaled = logits * inverse
    if mask.masks:
        scaled = mask_logits(scaled, top_k, top_p, min_p, mask.candidates)
    return torch.where(temperature > 0, race(scaled, seeds), greedy)
