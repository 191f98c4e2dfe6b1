"""A step's mid-chunk snapshot captures, as the GDN kernels read them.

The pairs (row of the flat batch, snapshot slot) are known on the host when the step is planned. Every
GDN layer of the step needs the same device tables, so they are built once, on first use, with one
copy from pinned memory: a copy from ordinary (pageable) host memory waits for the GPU to finish
everything queued before it, and one per layer would hold the host back at every layer."""

from __future__ import annotations

import torch

from deltaserve.host_to_device import to_device


class CaptureRows:
    def __init__(self, pairs):
        self.pairs = [(int(row), int(slot)) for row, slot in pairs]
        self._first_slot: dict[int, int] = {}  # row -> slot of its first capture
        self._repeats: list[tuple[int, int]] = []  # (slot, copy-from slot) of rows captured again
        for row, slot in self.pairs:
            if row in self._first_slot:
                self._repeats.append((slot, self._first_slot[row]))
            else:
                self._first_slot[row] = slot
        self._tables: dict = {}

    def __iter__(self):
        return iter(self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def _on(self, device: torch.device) -> torch.Tensor:
        """[4, n] int32 on `device`: every pair's row and slot (conv1d), then the distinct rows, sorted,
        and the slot of each one's first capture (GDN; padded to n)."""
        key = str(device)
        if key not in self._tables:
            distinct = sorted(self._first_slot)
            padding = [0] * (len(self.pairs) - len(distinct))
            rows = [[row for row, _ in self.pairs], [slot for _, slot in self.pairs],
                    distinct + padding, [self._first_slot[row] for row in distinct] + padding]
            self._tables[key] = (to_device(rows, device, torch.int32).reshape(4, len(self.pairs)), len(distinct))
        return self._tables[key]

    def all_pairs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        table, _ = self._on(device)
        return table[0], table[1]

    def distinct_rows(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
        """(rows, snapshot slots) over the distinct rows, sorted, and the (slot, copy-from slot) pairs of
        rows captured more than once."""
        table, count = self._on(device)
        return table[2, :count], table[3, :count], self._repeats


def as_capture_rows(capture_rows) -> CaptureRows:
    return capture_rows if isinstance(capture_rows, CaptureRows) else CaptureRows(capture_rows or ())


class GraphCaptureRows(CaptureRows):
    """The captures of a graph-replayed step: a fixed-size device table [4, n] (the layout `_on`
    builds) that the step refreshes before each replay. Its rows are distinct, so nothing repeats."""

    def __init__(self, table: torch.Tensor):
        super().__init__(())
        self.table = table

    @classmethod
    def of(cls, pairs, device: torch.device) -> "GraphCaptureRows":
        """A fixed table of the (row, slot) pairs, rows distinct, on `device`."""
        table, _ = CaptureRows(pairs)._on(device)
        return cls(table)

    def __len__(self) -> int:
        return self.table.shape[1]

    def __iter__(self):
        raise TypeError("a graph's capture rows live on the device")

    def _on(self, device: torch.device) -> tuple[torch.Tensor, int]:
        return self.table, self.table.shape[1]


def capture_tables(capture_rows, query_start_loc: torch.Tensor):
    """What the GDN kernels read: (rows, snapshot slots) over the distinct captured rows, sorted; the
    index of each sequence's first capture; and the (slot, copy-from slot) pairs of rows captured more
    than once (copied after the kernel). The search runs at every call, once per GDN layer: a graph
    replays it against the capture table of each replay, which a result kept from an earlier call
    would not see."""
    rows_t, snaps_t, repeats = as_capture_rows(capture_rows).distinct_rows(query_start_loc.device)
    first = torch.searchsorted(rows_t, query_start_loc[:-1].to(torch.int32), out_int32=True)
    return rows_t, snaps_t, first, repeats
