"""Grouped writes on Ray Data: tasks read and route rows, a shuffle groups them by key, one task writes each group.

Used by export (a group is one shard): the driver only sends the task list and the writer, and gets back the
writers' small result rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa

from datahub.engines.base import Engine
from datahub.engines.sink import Sink, WriteTask, task_results

R = TypeVar("R")


def _read_tasks(batch: pa.Table, tasks: Sequence[Any], read: Callable[[Any], Iterator[pa.Table]]) -> Iterator[pa.Table]:
    for index in batch.column("task").to_pylist():
        yield from read(tasks[index])


def _write_group(group: pa.Table, task: WriteTask[Any]) -> pa.Table:
    return task(group)


def write_groups(engine: Engine, tasks: Sequence[Any], *, read: Callable[[Any], Iterator[pa.Table]], key: str,
                 sink: Sink[R, Any], routed_schema: pa.Schema, workers: int | None = None) -> list[R]:
    """Run ``read(task)`` for every task (Arrow tables of ``routed_schema`` with a ``key`` column), then the
    sink's ``write`` once per key value with all its rows (a task of the write seam); return the tasks' results
    for the caller's ``sink.commit``. ``workers``: tasks at once (None: Ray decides). The Spark twin is
    ``datahub.engines.spark.export``."""
    import ray.data

    if not tasks:
        return []
    items = ray.data.from_items([{"task": i} for i in range(len(tasks))], override_num_blocks=len(tasks))
    options: dict[str, Any] = {"compute": ray.data.TaskPoolStrategy(size=workers)} if workers else {}
    routed = items.map_batches(partial(_read_tasks, tasks=list(tasks), read=read), batch_format="pyarrow",
                               batch_size=1, **options)
    written = routed.groupby(key).map_groups(partial(_write_group, task=WriteTask(sink)), batch_format="pyarrow",
                                             **options)
    results: list[R] = []
    for batch in written.iter_batches(batch_format="pyarrow", batch_size=None):
        results.extend(task_results(pa.table(batch) if isinstance(batch, pa.RecordBatch) else batch))
    return results
