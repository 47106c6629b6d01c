"""Hash shuffles on Ray core tasks, for RayFrame's groupby and join.

Ray Data's own hash shuffle starts aggregator actors and costs about ten seconds per call on a
small machine, whatever the data size; global operators (dedup's label propagation) call it
many times. Here a shuffle is two waves of plain tasks: each input block is split by key hash
into P parts (one task per block), then each of the P reducers concatenates its parts and runs
pyarrow's group_by or join. Data moves through the object store; nothing is collected on the
driver. The call returns once every reducer has ended: a failed task (or an interrupted driver)
cancels the shuffle's other tasks and waits for them before the error propagates, so none of them
runs on after the pass has failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import pyarrow as pa
import ray

from datahub.engines.partition import split_by_key
from datahub.engines.ray.tasks import cancel_and_wait


@ray.remote
def _split(table: pa.Table, keys: list[str], partitions: int) -> Any:
    # an empty block may carry no schema at all; reducers skip empty parts
    parts = [table] * partitions if table.num_rows == 0 else split_by_key(table, keys, partitions)
    pa.default_memory_pool().release_unused()  # the split copied the block; hand the scratch back
    return parts[0] if partitions == 1 else tuple(parts)


@ray.remote(num_returns=2)
def _reduce(fn: Callable[..., pa.Table], schemas: Sequence[pa.Schema], *sides_and_parts: Any) -> tuple[pa.Table, int]:
    """The partition's output and its row count: the driver waits on the small count, the table stays in the store."""
    # sides_and_parts: counts per side, then the parts of side 0, side 1, ...
    counts = sides_and_parts[: len(schemas)]
    parts = list(sides_and_parts[len(schemas):])
    tables = []
    for schema, count in zip(schemas, counts):
        mine, parts = parts[:count], parts[count:]
        mine = [p for p in mine if p.num_rows] or [schema.empty_table()]
        tables.append(pa.concat_tables(mine, promote_options="permissive"))
    result = fn(*tables)
    del tables, parts
    pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed pages unless told
    return result, result.num_rows


def hash_shuffle(
    sides: Sequence[tuple[list[ray.ObjectRef], pa.Schema]],
    keys: Sequence[list[str]],
    partitions: int,
    reduce_fn: Callable[..., pa.Table],
) -> list[ray.ObjectRef]:
    """Co-partition every side by its keys and run ``reduce_fn(side0, side1, ...)`` per partition; returns the
    partitions' tables (refs), once every reducer has ended."""
    split_tasks: list[Any] = []  # one ref per split task, to cancel it until the first reducer has ended
    pending: list[Any] = []  # the reducers' row counts, not yet got
    try:
        split_refs: list[list[list[ray.ObjectRef]]] = []  # side -> block -> partition
        for (blocks, _), side_keys in zip(sides, keys):
            per_block = []
            for block in blocks:
                out = _split.options(num_returns=partitions).remote(block, side_keys, partitions)
                # num_returns > 1: a list
                per_block.append([out] if partitions == 1 else list(cast(Sequence[Any], out)))
                split_tasks.append(per_block[-1][0])
            split_refs.append(per_block)
        schemas = [schema for _, schema in sides]
        results = []
        for p in range(partitions):
            counts = [len(per_block) for per_block in split_refs]
            parts = [per_block[b][p] for per_block in split_refs for b in range(len(per_block))]
            table, rows = cast(Sequence[Any], _reduce.remote(reduce_fn, schemas, *counts, *parts))
            results.append(table)
            pending.append(rows)
        del split_refs, parts  # the reducers hold the parts now
        while pending:  # as they end: a failed reducer (or the split it reads) raises at once, not after the others
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done[0])
            split_tasks = []  # all ended (a reducer reads a part of every block); a ref would pin its part
        return results
    finally:  # a task failed or the driver was interrupted: none of the shuffle may still run
        cancel_and_wait(split_tasks + pending)
