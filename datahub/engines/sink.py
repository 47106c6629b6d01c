"""The one write seam: how rows leave an engine for storage (a lake table's files, export shards, tier copies).

Shaped like Ray Data's ``Datasink``, with the lifecycle STYLE.md asks of every sink:

1. ``start()`` on the driver, once, before any row is written (create a folder, check a transaction);
2. ``write(batches)`` in the engine's tasks, once per task, over that task's part of the rows (a Ray
   block, a Spark partition, a batch on the in-process engine); it writes what it can on its own (a
   Parquet file, a tar shard) and returns a small, picklable description of it (file names, sizes,
   counts): only these descriptions travel back to the driver;
3. ``commit(results)`` on the driver, once, with every task's description, after every task succeeded:
   the one step that makes the writes visible (a Delta commit, a manifest), idempotent;
4. ``abort(results, error)`` on the driver instead of ``commit`` when a task or the commit failed:
   remove what the finished tasks wrote (best effort; uncommitted files are invisible to readers anyway).

A sink object is pickled to the tasks, so it holds only configuration (paths, schemas, options), never
open handles or the lake object's caches. Engines decide how tasks run it (``Frame.write``); callers
run the whole lifecycle with :func:`write_frame` (a frame on an engine) or :func:`write_batches` (rows
already on the driver, e.g. a stream read from the lake). Nothing here imports ray or pyspark.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import pyarrow as pa

from datahub.lake.add_actions import StagedFiles
from datahub.lake.files import ParquetTarget, data_file, remove_files, write_file

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

R = TypeVar("R")  # what one task's write returns: small and picklable
O = TypeVar("O")  # what the commit returns (a table version, a manifest)

# One row per task: its pickled ``write`` result (the engines carry it back as an ordinary column).
RESULT = pa.schema([("result", pa.binary())])


class Sink(ABC, Generic[R, O]):
    """start -> write (in tasks) -> commit, or abort; see the module docstring."""

    def start(self) -> None:  # noqa: B027 - most sinks need no set-up
        """Driver, once, before any task writes."""

    @abstractmethod
    def write(self, batches: Iterable[pa.Table]) -> R:
        """In a task: write this task's rows; return their small, picklable description."""

    @abstractmethod
    def commit(self, results: list[R]) -> O:
        """Driver, once, after every task succeeded: make the writes visible (idempotently)."""

    def abort(self, results: list[R], error: BaseException) -> None:  # noqa: B027 - nothing to remove by default
        """Driver, instead of ``commit``: remove what the finished tasks wrote (best effort)."""


@dataclass(frozen=True)
class WriteTask(Generic[R]):
    """Batch function an engine runs in its tasks: ``sink.write`` over the batches, its result pickled
    into one ``RESULT`` row. Engines that hand a task all its batches at once call ``over``."""

    sink: Sink[R, object]

    def __call__(self, table: pa.Table) -> pa.Table:
        return self.over([table])

    def over(self, batches: Iterable[pa.Table]) -> pa.Table:
        result = self.sink.write(batches)
        return pa.table({"result": [pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)]}, schema=RESULT)


def task_results(rows: pa.Table) -> list[Any]:
    """The tasks' results from the ``RESULT`` rows an engine gathered."""
    return [pickle.loads(blob) for blob in rows.column("result").to_pylist()]


def write_frame(frame: Frame, sink: Sink[R, O]) -> O:
    """The whole lifecycle over ``frame``: start, ``frame.write`` (the engine's tasks), commit; abort on failure."""
    sink.start()
    results: list[R] = []
    try:
        results = frame.write(sink)
        return sink.commit(results)
    except BaseException as exc:
        sink.abort(results, exc)
        raise


def write_batches(batches: Iterable[pa.Table], sink: Sink[R, O]) -> O:
    """The whole lifecycle for rows streamed on the driver: one task (this process) writes them all."""
    sink.start()
    results: list[R] = []
    try:
        results = [sink.write(batches)]
        return sink.commit(results)
    except BaseException as exc:
        sink.abort(results, exc)
        raise


# ---- sinks of lake tables ------------------------------------------------------------------


@dataclass(frozen=True)
class TableFilesSink(Sink[dict[str, Any] | None, StagedFiles | None]):
    """Each task writes its rows as one Parquet file of ``target`` (a lake table's folder); the commit
    gathers them as ``StagedFiles``, which the caller commits to the table with its transaction (a run
    commits its tables in a fixed order, after all of them are written). None when no row was written."""

    target: ParquetTarget

    def write(self, batches: Iterable[pa.Table]) -> dict[str, Any] | None:
        return write_file(self.target, batches)

    def commit(self, results: list[dict[str, Any] | None]) -> StagedFiles | None:
        files = tuple(data_file(r) for r in results if r is not None)
        return StagedFiles(files, self.target.schema) if sum(f.rows for f in files) else None

    def abort(self, results: list[dict[str, Any] | None], error: BaseException) -> None:
        remove_files(self.target, [r["uri"] for r in results if r is not None])


class SplitRows(Protocol):
    """One batch of a graph's output split into the rows of three tables (the pipeline's samples sink)."""

    @property
    def samples(self) -> pa.Table: ...

    @property
    def quarantine(self) -> pa.Table | None: ...

    @property
    def lineage(self) -> pa.Table: ...

    def counts_json(self) -> str:
        """The batch's counts, serialized (merged on the driver)."""


SplitFn = Callable[[pa.Table], SplitRows]


@dataclass(frozen=True)
class SplitWritten:
    """What an engine's tasks wrote for a split graph output: uncommitted files per table, per-batch counts."""

    counts: list[str]
    samples: StagedFiles
    quarantine: StagedFiles
    lineage: StagedFiles
