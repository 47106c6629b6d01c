"""A tiny single-process ``Frame`` over an in-memory pyarrow Table, for testing global operators."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import pyarrow as pa

from datahub.engines.frame import Aggregate, BatchFn, Frame

_JOIN_TYPES = {"inner": "inner", "left": "left outer", "left_anti": "left anti"}


class ArrowFrame(Frame):
    """Eager: every operation returns a new frame over a new table; batches of ``batch_size`` rows."""

    def __init__(self, table: pa.Table, *, batch_size: int = 1000) -> None:
        self.table = table
        self.batch_size = batch_size

    def _new(self, table: pa.Table) -> ArrowFrame:
        return ArrowFrame(table, batch_size=self.batch_size)

    def map_batches(self, fn: BatchFn, *, name: str = "map") -> Frame:
        outputs = [fn(pa.Table.from_batches([b], self.table.schema)) for b in self.table.to_batches(self.batch_size)]
        if not outputs:
            outputs = [fn(self.table.schema.empty_table())]
        return self._new(pa.concat_tables(outputs, promote_options="permissive"))

    def groupby_agg(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]]) -> Frame:
        grouped = self.table.group_by(keys, use_threads=False).aggregate(
            [(column, agg) for column, agg in aggregations.values()]
        )
        names = {f"{column}_{agg}": out for out, (column, agg) in aggregations.items()}
        return self._new(grouped.rename_columns([names.get(c, c) for c in grouped.column_names]))

    def join(self, other: Frame, *, on: list[str], how: Literal["inner", "left", "left_anti"] = "inner") -> Frame:
        assert isinstance(other, ArrowFrame)
        return self._new(self.table.join(other.table, keys=on, join_type=_JOIN_TYPES[how], use_threads=False))

    def union(self, other: Frame) -> Frame:
        assert isinstance(other, ArrowFrame)
        return self._new(pa.concat_tables([self.table, other.table.select(self.table.column_names)]))

    def materialize(self) -> Frame:
        return self

    def count(self) -> int:
        return self.table.num_rows

    def iter_batches(self) -> Iterator[pa.Table]:
        for batch in self.table.to_batches(self.batch_size):
            yield pa.Table.from_batches([batch], self.table.schema)

    def empty(self) -> pa.Table:
        return self.table.schema.empty_table()
