"""The engine-neutral distributed table that global operators are written against.

Ray (``datahub.engines.ray``) and Spark (``datahub.engines.spark``) each implement it,
so dedup and connected components are written once and give identical results on both.
Every function passed in maps ``pyarrow.Table -> pyarrow.Table`` and must be picklable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pyarrow as pa

from datahub.engines.sink import RESULT, WriteTask, task_results

if TYPE_CHECKING:
    from datahub.engines.sink import Sink

BatchFn = Callable[[pa.Table], pa.Table]
Aggregate = Literal["min", "max", "sum", "count"]
R = TypeVar("R")


class Frame(ABC):
    """A lazily evaluated, partitioned table of rows on one engine."""

    @abstractmethod
    def map_batches(self, fn: BatchFn, *, name: str = "map") -> Frame:
        """Apply ``fn`` to each batch; it may change rows and columns."""

    @abstractmethod
    def groupby_agg(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]], *,
                    having: BatchFn | None = None) -> Frame:
        """Group by ``keys``; output columns: the keys plus ``{out: (column, aggregate)}``.

        ``having`` filters or projects the groups where they are computed (e.g. keep keys shared
        by more than one row), so groups it drops are never stored.
        """

    @abstractmethod
    def join(self, other: Frame, *, on: list[str], how: Literal["inner", "left", "left_anti"] = "inner") -> Frame:
        """Hash join on ``on``."""

    @abstractmethod
    def union(self, other: Frame) -> Frame:
        """Rows of both frames (same schema)."""

    @abstractmethod
    def materialize(self) -> Frame:
        """Compute now and keep the result, so branches that share it do not recompute it."""

    def reusable(self) -> Frame:
        """This frame ready to be read several times: materialized, unless it is ``light``."""
        return self.materialize()

    def light(self) -> Frame:
        """This frame, marked cheaper to recompute than to hold: ``reusable`` then keeps it lazy.

        For a global operator's output that is a cheap map (a broadcast join, a mark) over
        blocks it materialized itself: a later operator reading it several times recomputes
        the map instead of holding a second copy of the documents. Engines may ignore it.
        """
        return self

    @abstractmethod
    def count(self) -> int: ...

    @abstractmethod
    def iter_batches(self) -> Generator[pa.Table, None, None]:
        """Stream the rows to the driver, batch by batch. A consumer that may stop early or fail closes the
        generator (``contextlib.closing``): an error it raises keeps the generator alive in its traceback, and on
        Ray the executor and its tasks run on until the generator is closed or collected."""

    def to_arrow(self) -> pa.Table:
        """All rows as one table on the driver: for small results only."""
        batches = [b for b in self.iter_batches() if b.num_rows]
        if not batches:
            return self.empty()
        return pa.concat_tables(batches, promote_options="permissive")

    @abstractmethod
    def empty(self) -> pa.Table:
        """An empty table with this frame's schema."""

    def write(self, sink: Sink[R, Any]) -> list[R]:
        """Run ``sink.write`` in this frame's tasks and return their results (``datahub.engines.sink``).

        Here one task per batch (a Ray block, an in-process batch); an engine whose tasks see a whole
        partition gives each task all of its batches. Callers use ``write_frame``, which also commits.
        """
        rows = self.map_batches(WriteTask(sink), name=f"write_{type(sink).__name__}").to_arrow()
        return task_results(rows) if RESULT.names[0] in rows.column_names else []
