"""GdnStash: a verify graph's GDN inputs kept until its verdicts, so that each sequence's recurrent state is
advanced once, through the rows it kept (kernels.commit_gated_delta_rule).

In a verify graph every GDN layer runs its token loop over each sequence's k + 1 rows without writing the state
back (store_state=False), and copies the rows' k and v (after the conv, side by side in its output) and b and a
(side by side in the input projection) here. Once the sampler has taken its verdicts, one launch reads each
sequence's state in every layer, runs the rows it kept through it with the loop's arithmetic and writes it back.
So a refuted draft costs no copy of the state: the state after its last kept row is the only one ever written.
The conv states, a few rows each, are still captured after every row and copied back (SpeculativeStep).
"""

from __future__ import annotations

import torch

from deltaserve import kernels
from deltaserve.host_to_device import to_device


class GdnStash:
    def __init__(self, gdn_layers: dict, max_rows: int, dtype: torch.dtype, device: torch.device):
        """gdn_layers: {layer index: GatedDeltaNet}, in the order of the StatePool's layers."""
        first = next(iter(gdn_layers.values()))
        self.key_size, self.value_size = first.key_size, first.value_size
        self.num_v_heads = first.num_v_heads
        self.position = {layer: i for i, layer in enumerate(gdn_layers)}
        count = len(gdn_layers)
        self.kv = torch.zeros(count, max_rows, self.key_size + self.value_size, dtype=dtype, device=device)
        self.ba = torch.zeros(count, max_rows, 2 * self.num_v_heads, dtype=dtype, device=device)
        # the layers' gating parameters side by side, copied once (the weights do not change after start-up)
        self.A_log = torch.stack([m.A_log.detach().float() for m in gdn_layers.values()]).contiguous()
        self.dt_bias = torch.stack([m.dt_bias.detach().float() for m in gdn_layers.values()]).contiguous()
        self._k_shape = (first.num_k_heads, first.k_dim)
        self._v_shape = (first.num_v_heads, first.v_dim)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.ba, self.A_log, self.dt_bias))

    def keep(self, layer_idx: int, kv: torch.Tensor, ba: torch.Tensor) -> None:
        """Layer `layer_idx`'s rows: kv [T, key_size + value_size] (k then v), ba [T, 2 Hv] (b then a)."""
        at = self.position[layer_idx]
        self.kv[at, : kv.shape[0]].copy_(kv)
        self.ba[at, : ba.shape[0]].copy_(ba)

    def commit(self, h_all: torch.Tensor, state_slots: list[int], row_count: list[int], rows_per_seq: int,
               step_seqs: int) -> None:
        """Sequence i's states (h_all [layers, slots, ...], the StatePool's) through its first row_count[i] rows of
        the stashed step (from i * rows_per_seq), which ran step_seqs sequences."""
        if not state_slots:
            return
        n = len(state_slots)
        width = -(-n // 4) * 4  # the second row 16-byte aligned, as Triton compiles the kernel for every pointer
        table = to_device([list(c) + [0] * (width - n) for c in (state_slots, row_count)], h_all.device,
                          torch.int32)[:, :n]
        k = self.kv[..., : self.key_size].unflatten(-1, self._k_shape)
        v = self.kv[..., self.key_size :].unflatten(-1, self._v_shape)
        b, a = self.ba[..., : self.num_v_heads], self.ba[..., self.num_v_heads :]
        kernels.commit_gated_delta_rule(k, v, a, b, self.A_log, self.dt_bias, h_all, table[0], table[1],
                                        rows_per_seq, step_seqs)
