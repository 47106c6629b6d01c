"""Grouped writes on Ray Data: tasks read and route rows, a shuffle groups them by key, one task writes each group.

Used by export (a group is one shard): the driver only sends the task list and the writer, and gets back the
writers' small result rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from datahub.engines.base import Engine


def _read_tasks(batch: pa.Table, tasks: Sequence[Any], read: Callable[[Any], Iterator[pa.Table]]) -> Iterator[pa.Table]:
    for index in batch.column("task").to_pylist():
        yield from read(tasks[index])


def _write_group(group: pa.Table, write: Callable[[pa.Table], pa.Table]) -> pa.Table:
    return write(group)


def write_groups(engine: Engine, tasks: Sequence[Any], *, read: Callable[[Any], Iterator[pa.Table]], key: str,
                 write: Callable[[pa.Table], pa.Table], routed_schema: pa.Schema, result_schema: pa.Schema,
                 workers: int | None = None) -> pa.Table:
    """Run ``read(task)`` for every task (Arrow tables of ``routed_schema`` with a ``key`` column), then
    ``write(rows)`` once per key value with all its rows; return the concatenated results (``result_schema``).
    ``workers``: tasks at once (None: Ray decides). The Spark twin is ``datahub.engines.spark.export``."""
    import ray.data

    if not tasks:
        return result_schema.empty_table()
    items = ray.data.from_items([{"task": i} for i in range(len(tasks))], override_num_blocks=len(tasks))
    compute = ray.data.TaskPoolStrategy(size=workers) if workers else None
    routed = items.map_batches(_read_tasks, fn_args=(list(tasks), read), batch_format="pyarrow", batch_size=1,
                               compute=compute)
    written = routed.groupby(key).map_groups(_write_group, fn_args=(write,), batch_format="pyarrow", compute=compute)
    tables = [pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b
              for b in written.iter_batches(batch_format="pyarrow", batch_size=None)]
    tables = [t.select(result_schema.names).cast(result_schema) for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else result_schema.empty_table()
