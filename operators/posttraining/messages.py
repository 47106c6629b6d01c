"""Flattened views of the post-training list columns, so operators work per message/step with Arrow kernels.

A ``list<struct>`` column of a batch (``messages``, ``prompt``, ``chosen``, ``rejected``, ``steps``) becomes its
flat struct values plus, for each value, the row it belongs to (``parent``) and its position in that row
(``position``). Per-row results come back with ``per_row`` (a ``bincount`` over ``parent``); a null list reads
as an empty one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Flat:
    rows: int
    values: pa.StructArray
    parent: np.ndarray  # int64, the row of each value
    position: np.ndarray  # int64, index of the value within its row
    offsets: np.ndarray  # int64, rows + 1
    valid: pa.Array | None  # the rows whose list is not null (None: all)

    def field(self, name: str) -> pa.Array:
        return self.values.field(name)

    def per_row(self, mask: np.ndarray) -> np.ndarray:
        """How many values of each row have ``mask`` true."""
        return np.bincount(self.parent[mask], minlength=self.rows).astype(np.int64)

    def previous(self, values: np.ndarray, fill: object) -> np.ndarray:
        """Each value's predecessor in the same row (``fill`` for a row's first value)."""
        out = np.empty_like(values)
        if len(values):
            out[1:] = values[:-1]
            out[self.position == 0] = fill
        return out

    def last(self) -> np.ndarray:
        """Index of each row's last value (-1 for an empty or null row)."""
        return np.where(self.offsets[1:] > self.offsets[:-1], self.offsets[1:] - 1, -1)

    def with_field(self, name: str, values: pa.Array) -> pa.ListArray:
        """The list column again, with struct field ``name`` replaced by ``values`` (same lists, same nulls)."""
        fields = [values if f.name == name else self.values.field(f.name) for f in self.values.type]
        struct = pa.StructArray.from_arrays(fields, fields=list(self.values.type))
        mask = None if self.valid is None else pc.invert(self.valid)
        return pa.ListArray.from_arrays(pa.array(self.offsets.astype(np.int32)), struct, mask=mask)


def flatten(column: pa.Array | pa.ChunkedArray) -> Flat:
    lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = lists.flatten()  # the values of non-null lists, in order
    parent = np.repeat(np.arange(len(lists), dtype=np.int64), lengths)
    position = np.arange(len(parent), dtype=np.int64) - offsets[parent]
    return Flat(len(lists), values, parent, position, offsets, lists.is_valid() if lists.null_count else None)


def strings(array: pa.Array) -> pa.Array:
    """A string field with nulls as empty strings."""
    return pc.fill_null(array, "")


def as_bool(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)
