"""GdnStash: a verify step's GDN inputs kept until its verdicts, so that each sequence's recurrent state is
advanced once, through the rows it kept (kernels.commit_gated_delta_rule).

In a verify step every GDN layer runs its verify chunks' rows without writing their states back (a verify graph's
token loop with store_state=False; an eager pass, whose prompt chunks do write theirs, with a flag a sequence), and
copies the rows' k and v (after the conv, side by side in its output) and b and a (side by side in the input
projection) here, sequence i's k + 1 rows from row i * (k + 1). Once the sampler has taken its verdicts, one launch
reads each sequence's state in every layer, runs the rows it kept through it with the token loop's arithmetic and
writes it back. So a refuted draft costs no copy of the state, and no slot holds the recurrent state after each
verify row: the state after its last kept row is the only one ever written. The conv states, a few rows each, are
still captured after every row into conv-only verify slots and copied back (SpeculativeStep).
"""

from __future__ import annotations

import torch

from deltaserve import kernels
from deltaserve.host_to_device import columns_to_device


class GdnStash:
    @classmethod
    def of(cls, model, layer_ids: list[int], max_rows: int) -> GdnStash:
        """The stash of `model`'s GDN layers, in the order of layer_ids (the StatePool's)."""
        from deltaserve.models.layers.gated_delta_net import GatedDeltaNet

        mixers = {m.layer_idx: m for m in model.modules() if isinstance(m, GatedDeltaNet)}
        first = mixers[layer_ids[0]]
        return cls({layer: mixers[layer] for layer in layer_ids}, max_rows, first.in_proj.dtype, first.in_proj.device)

    @staticmethod
    def bytes_for(num_layers: int, max_rows: int, key_size: int, value_size: int, num_v_heads: int,
                  dtype: torch.dtype) -> int:
        """The bytes of the rows' buffers a stash of max_rows rows holds (its gating parameters aside)."""
        return num_layers * max_rows * (key_size + value_size + 2 * num_v_heads) * dtype.itemsize

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
        # the commit's operands: views of the buffers, which never move
        self._k = self.kv[..., : self.key_size].unflatten(-1, (first.num_k_heads, first.k_dim))
        self._v = self.kv[..., self.key_size :].unflatten(-1, (first.num_v_heads, first.v_dim))
        self._b, self._a = self.ba[..., : self.num_v_heads], self.ba[..., self.num_v_heads :]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.ba, self.A_log, self.dt_bias))

    def keep(self, layer_idx: int, kv: torch.Tensor, ba: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Layer `layer_idx`'s rows: kv [T, key_size + value_size] (k then v), ba [T, 2 Hv] (b then a); `rows` [R]:
        the pass's row that each stash row takes (None: the pass's rows as they lie, a verify graph's)."""
        at = self.position[layer_idx]
        if rows is None:
            self.kv[at, : kv.shape[0]].copy_(kv)
            self.ba[at, : ba.shape[0]].copy_(ba)
            return
        torch.index_select(kv, 0, rows, out=self.kv[at, : rows.shape[0]])
        torch.index_select(ba, 0, rows, out=self.ba[at, : rows.shape[0]])

    def commit(self, h_all: torch.Tensor, state_slots: list[int], row_count: list[int], rows_per_seq: int,
               step_seqs: int) -> None:
        """Sequence i's states (h_all [layers, slots, ...], the StatePool's) through its first row_count[i] rows of
        the stashed step (from i * rows_per_seq), which ran step_seqs sequences."""
        if not state_slots:
            return
        slots, counts = columns_to_device([state_slots, row_count], h_all.device)
        kernels.commit_gated_delta_rule(self._k, self._v, self._a, self._b, self.A_log, self.dt_bias, h_all, slots,
                                        counts, rows_per_seq, step_seqs)
