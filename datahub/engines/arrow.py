"""A single-process ``Frame`` over an in-memory pyarrow Table: no cluster, no workers.

Engine-neutral reference implementation of the Frame interface: global operators
(dedup) run on it in benchmarks and unit tests exactly as on Ray or Spark.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Literal

import pyarrow as pa

from datahub.engines.base import Engine, ReadFn
from datahub.engines.frame import Aggregate, BatchFn, Frame
from datahub.engines.kernels import aggregate_table, join_tables


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

    def groupby_agg(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]], *,
                    having: BatchFn | None = None) -> Frame:
        groups = aggregate_table(self.table, keys, aggregations)
        return self._new(having(groups) if having is not None else groups)

    def join(self, other: Frame, *, on: list[str], how: Literal["inner", "left", "left_anti"] = "inner") -> Frame:
        assert isinstance(other, ArrowFrame)
        return self._new(join_tables(self.table, other.table, on, how))

    def union(self, other: Frame) -> Frame:
        assert isinstance(other, ArrowFrame)
        right = other.table.select(self.table.column_names)
        return self._new(pa.concat_tables([self.table, right], promote_options="permissive"))

    def materialize(self) -> Frame:
        return self

    def count(self) -> int:
        return self.table.num_rows

    def iter_batches(self) -> Generator[pa.Table, None, None]:
        for batch in self.table.to_batches(self.batch_size):
            yield pa.Table.from_batches([batch], self.table.schema)

    def empty(self) -> pa.Table:
        return self.table.schema.empty_table()



class ArrowEngine(Engine):
    """The in-process engine over ``ArrowFrame``: pass ``engine=ArrowEngine()`` to ``run_job``.

    For benchmarks and small jobs: reads files one after another on the driver, no workers.
    """

    name = "arrow"

    def __init__(self, *, batch_size: int = 8192) -> None:
        self.batch_size = batch_size

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def read_files(self, files: Sequence[Any], read: ReadFn) -> ArrowFrame:
        """The tables ``read`` yields, concatenated; tables of no rows are dropped, but when every table is empty the
        frame keeps the first one's schema (as Ray and Spark do), so a join or select on its columns still works."""
        tables: list[pa.Table] = []
        first_empty: pa.Table | None = None
        for f in files:
            for t in read(f):
                if t.num_rows:
                    tables.append(t)
                elif first_empty is None:
                    first_empty = t
        if not tables:
            return ArrowFrame(first_empty if first_empty is not None else pa.table({}), batch_size=self.batch_size)
        return ArrowFrame(pa.concat_tables(tables, promote_options="permissive"), batch_size=self.batch_size)

    def from_arrow(self, table: pa.Table) -> ArrowFrame:
        return ArrowFrame(table, batch_size=self.batch_size)
