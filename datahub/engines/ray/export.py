"""Grouped writes on Ray, two ways.

``spill_runs`` + ``write_slices`` (the text export): a sort-based shuffle through local disk. Each read task encodes
one data file, sorts its rows in the caller's order and writes them as one Arrow IPC file (a *run*) on its node's
disk, sending back only a small summary (ids and sizes); the driver plans the groups (shards) from the summaries,
and each write task reads its group's slice of every run (memory-mapped on the same node; through a task on the
run's node otherwise) and hands the rows to the sink. The release is read and encoded once, and nothing large goes
through the object store: with the embedded Ray's capped store the previous shuffle spilled every encoded row
through Ray's IO worker (L of benchmarks/release_scale.py: 2.5 GB of shards, the write phase 28 s of 43 s).
``write_pieces`` (token files) is its write pass for groups larger than a task should hold: a group's task gathers
its rows a piece (a chunk of a token file's export order) at a time and streams them to the sink. Both read through
``_RunReader``: a task memory-maps each run on its node once for its whole group, and gets a piece's slices of
another node's runs from one task on that node.

``write_groups``: a one-round shuffle through the object store. A read task splits its routed rows into
``partitions`` tables by ``key % partitions`` (Ray returns them as separate objects), and each write task gets its
partition's table from every read task and writes its groups one at a time, in key order. Measured on a 2-core
machine: Ray Data's ``groupby`` (sample, sort, merge, map_groups: three all-to-all stages) cost about 7 s for
77 MB of shards, this round a fraction of it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.allocator import arrow_pool
from datahub.engines.base import Engine
from datahub.engines.ray.tasks import cancel_and_wait, map_tasks
from datahub.engines.sink import RESULT, Sink, WriteTask, task_results

R = TypeVar("R")
MAX_PARTITIONS = 256  # objects per read task; a write task then writes groups/256 groups one at a time


def _split(task: Any, read: Callable[[Any], Iterator[pa.Table]], key: str, partitions: int,
           schema: pa.Schema) -> tuple[int | pa.Table, ...]:
    """One read task: its rows' count (what the driver waits on: a failed read raises there, and no rows travel
    to the driver), then its routed rows split by ``key % partitions`` (one table per partition, maybe empty)."""
    parts = [t for t in read(task) if t.num_rows]
    rows = pa.concat_tables(parts) if parts else schema.empty_table()
    if not rows.num_rows:
        return (0, *(schema.empty_table() for _ in range(partitions)))
    target = np.asarray(rows[key].combine_chunks()) % partitions
    order = np.argsort(target, kind="stable")
    grouped = rows.take(pa.array(order))
    bounds = np.searchsorted(target[order], np.arange(partitions + 1))
    return (rows.num_rows, *(grouped.slice(int(bounds[p]), int(bounds[p + 1] - bounds[p])) for p in range(partitions)))


def _write_partition(task: WriteTask[Any], key: str, *parts: pa.Table) -> list[pa.Table]:
    """One write task: every group of its partition, in key order, each written whole by the sink."""
    rows = pa.concat_tables([p for p in parts if p.num_rows]) if any(p.num_rows for p in parts) else None
    if rows is None:
        return []
    keys = rows[key].combine_chunks()
    results = []
    for value in np.unique(np.asarray(keys)).tolist():
        results.append(task(rows.filter(pc.equal(keys, value)).combine_chunks()))
    return results


def write_groups(engine: Engine, tasks: Sequence[Any], *, read: Callable[[Any], Iterator[pa.Table]], key: str,
                 sink: Sink[R, Any], routed_schema: pa.Schema, workers: int | None = None,
                 groups: int | None = None) -> list[R]:
    """Run ``read(task)`` for every task (Arrow tables of ``routed_schema`` with an int64 ``key`` column), then the
    sink's ``write`` once per key value with all its rows (a task of the write seam); return the tasks' results
    for the caller's ``sink.commit``. ``workers``: tasks at once (None: Ray's CPUs decide); ``groups``: how many
    key values there are, when known (sizes the shuffle). A failed task (or an error in the driver) stops the pass:
    its other tasks are cancelled and none runs when the error reaches the caller. The Spark twin is
    ``datahub.engines.spark.export``."""
    import ray

    if not tasks:
        return []
    parallel = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    partitions = max(1, min(groups or 4 * parallel, MAX_PARTITIONS))
    split = ray.remote(_split).options(num_returns=partitions + 1)
    write = ray.remote(_write_partition)
    outputs: list[list[Any]] = []  # per read task, its partitions' object refs
    reading: list[Any] = []  # the read tasks' row counts not yet seen
    writing: list[Any] = []
    results: list[R] = []
    try:
        for item in tasks:  # at most ``parallel`` read tasks at once
            if len(reading) >= parallel:
                reading = _wait_one(reading)
            refs: list[Any] = list(split.remote(item, read, key, partitions, routed_schema))  # type: ignore[call-overload]
            outputs.append(refs[1:])
            reading.append(refs[0])
        while reading:  # every read succeeded before a write starts: a failed one stops the pass here
            reading = _wait_one(reading)
        write_task = WriteTask(sink)
        for partition in range(partitions):
            if len(writing) >= parallel:
                writing = _wait_one(writing, results)
            writing.append(write.remote(write_task, key, *[refs[partition] for refs in outputs]))
            for refs in outputs:  # the write task holds its inputs now: the store frees them when it is done
                refs[partition] = None
        while writing:
            writing = _wait_one(writing, results)
    finally:  # a task failed or the driver stopped: no task of the pass may go on writing after the caller returns
        cancel_and_wait(reading + writing)
    return results


def _wait_one(pending: list[Any], results: list[Any] | None = None) -> list[Any]:
    """Wait for one task of ``pending`` and get its value (a failed task raises its error here; a write task's
    results go to ``results``); returns the tasks still pending."""
    import ray

    done, pending = ray.wait(pending, num_returns=1)
    for value in ray.get(done):
        if results is not None:
            for table in value:
                results.extend(task_results(table))
    return pending


# ---- sorted runs on the workers' local disks -----------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One read task's rows, sorted by the caller, in an Arrow IPC file on the local disk of the node that ran it."""

    node: str  # Ray node id
    path: str
    rows: int


def _node() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _spill_run(task: Any, index: int, read: Callable[[Any], tuple[pa.Table, pa.Table]], directory: str,
               ) -> tuple[Run, pa.Table]:
    # Arrow's own pool while the task decodes, encodes and sorts (the workers run malloc with a 128 kB mmap
    # threshold: every large buffer would be a fresh mapping, faulted in page by page); released after
    with arrow_pool():
        rows, summary = read(task)
        os.makedirs(directory, exist_ok=True)  # another node of a cluster: the driver made it only on its own
        path = os.path.join(directory, f"run-{index:06d}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, rows.schema) as writer:
            writer.write_table(rows)
        run = Run(_node(), path, rows.num_rows)
        del rows
    return run, summary


def spill_runs(engine: Engine, tasks: Sequence[Any], *, read: Callable[[Any], tuple[pa.Table, pa.Table]],
               directory: str, workers: int | None = None) -> Iterator[tuple[Run, pa.Table]]:
    """The read pass of a sort-based shuffle: ``read(task)`` in a Ray task per task, ``workers`` at once, returns
    (rows sorted by the caller's key, a small summary of them); the task keeps the rows in ``directory`` on its node's
    disk (a ``Run``) and only the summary travels back. Yields (run, summary) in task order, so the driver can plan
    which slice of each run every group takes (``write_slices``). Nothing goes through the object store but the
    summaries: a capped store never spills, and memory is a few tasks' rows, not the data set's."""
    # ``yield from``: closing this generator closes map_tasks', which cancels and waits for the tasks in flight
    yield from map_tasks(engine, list(enumerate(tasks)), partial(_spill_run_item, read=read, directory=directory),
                         workers=workers)


def _spill_run_item(item: tuple[int, Any], read: Callable[[Any], tuple[pa.Table, pa.Table]],
                    directory: str) -> tuple[Run, pa.Table]:
    index, task = item
    return _spill_run(task, index, read, directory)


def _open_run(path: str) -> pa.Table:
    """A run's rows, memory-mapped (a slice touches only its own pages)."""
    with pa.memory_map(path, "r") as source:
        return pa.ipc.open_file(source).read_all()


def _fetch_slices(slices: Sequence[tuple[str, int, int]]) -> list[pa.Table]:
    """Rows ``[start, stop)`` of runs on this node, one table a (path, start, stop), copied out of the files (they
    travel to another node's task); each run is opened once."""
    opened: dict[str, pa.Table] = {}
    tables = []
    for path, start, stop in slices:
        if path not in opened:
            opened[path] = _open_run(path)
        tables.append(opened[path].slice(start, stop - start).combine_chunks())
    return tables


Slice = tuple[int, int, int]  # run index, first row, end row
_Started = tuple[list[pa.Table | None], list[tuple[list[int], Any]]]  # ``_RunReader.start``: parts, fetches


def _write_slices(task: WriteTask[Any], key: str, value: int, runs: Sequence[Run], slices: Sequence[Slice],
                  local_reads: bool) -> pa.Table:
    """One write task: its group's rows from every run (a zero-copy slice of a run on this node, else a task on
    the run's node sends them), with the ``key`` column, written whole by the sink."""
    with arrow_pool():  # as in ``_spill_run``
        return _write_group(task, key, value, runs, slices, local_reads)


# A write task keeps its local runs mapped until it has sliced this much from them, then maps them again: the pages
# a mapping has read stay resident until it is unmapped, so one mapping per run for a whole file would hold the
# file; remapping per piece costs an open per run per piece (~0.75 ms each, 1,000 runs: 0.75 s a piece).
REMAP_BYTES = 128 << 20  # four default token chunks (datahub.export.tokens)


class _RunReader:
    """A write task's reads of the runs, for its whole group: a run on this node is memory-mapped once per
    ``remap_bytes`` sliced (the first slice that needs it; a slice touches only its own pages) and sliced
    zero-copy; the slices of runs on another node come from one task on that node per ``start`` (a piece), not
    one per run. ``local_reads=False`` fetches every slice, as between nodes."""

    def __init__(self, runs: Sequence[Run], local_reads: bool, remap_bytes: int = REMAP_BYTES) -> None:
        self.runs = runs
        self.local_reads = local_reads
        self.remap_bytes = remap_bytes
        self.here = _node()
        self.opened: dict[int, pa.Table] = {}
        self.sliced = 0  # bytes sliced from the current mappings
        self.fetch: Any = None  # the remote ``_fetch_slices``, made at the first fetch

    def start(self, slices: Sequence[Slice]) -> _Started:
        """The rows of ``slices``: the local ones sliced now, the remote ones' fetches started (one per node)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        parts: list[pa.Table | None] = []
        remote: dict[str, list[int]] = {}
        if self.sliced >= self.remap_bytes:  # slices handed out keep their mapping alive until they are dropped
            self.opened.clear()
            self.sliced = 0
        for position, (run_index, start, stop) in enumerate(slices):
            run = self.runs[run_index]
            if self.local_reads and run.node == self.here:
                if run_index not in self.opened:
                    self.opened[run_index] = _open_run(run.path)
                part = self.opened[run_index].slice(start, stop - start)
                self.sliced += part.nbytes
                parts.append(part)
            else:
                parts.append(None)
                remote.setdefault(run.node, []).append(position)
        fetches: list[tuple[list[int], Any]] = []
        for node, positions in remote.items():
            if self.fetch is None:
                import ray

                self.fetch = ray.remote(_fetch_slices)
            fetch = self.fetch.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                                       num_cpus=0)
            wanted = [(self.runs[slices[i][0]].path, slices[i][1], slices[i][2]) for i in positions]
            fetches.append((positions, fetch.remote(wanted)))
        return parts, fetches

    @staticmethod
    def finish(started: _Started, key: str, value: int) -> list[pa.Table]:
        """The tables of ``start`` in slice order (waiting for the fetches), each with the ``key`` column in front."""
        import ray

        parts, fetches = started
        if fetches:
            for (positions, _), tables in zip(fetches, ray.get([ref for _, ref in fetches]), strict=True):
                for position, table in zip(positions, tables, strict=True):
                    parts[position] = table
        tables = [t for t in parts if t is not None]
        return [t.add_column(0, key, pa.array(np.full(t.num_rows, value, dtype=np.int64))) for t in tables
                if t.num_rows]


def _write_group(task: WriteTask[Any], key: str, value: int, runs: Sequence[Run], slices: Sequence[Slice],
                 local_reads: bool) -> pa.Table:
    reader = _RunReader(runs, local_reads)
    keyed = reader.finish(reader.start(slices), key, value)
    if not keyed:
        return RESULT.empty_table()
    result = task.over(keyed)
    del keyed
    pa.default_memory_pool().release_unused()
    return result


def _windowed(remote: Any, calls: Iterable[tuple[Any, ...]], parallel: int) -> Iterator[Any]:
    """Run ``remote`` once per argument tuple, ``parallel`` tasks at once; yield their sink results as they finish."""
    import ray

    pending: list[Any] = []
    try:
        for arguments in calls:
            if len(pending) >= parallel:
                done, pending = ray.wait(pending, num_returns=1)
                for table in ray.get(done):
                    yield from task_results(table)
            pending.append(remote.remote(*arguments))
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for table in ray.get(done):
                yield from task_results(table)
    finally:  # a failed or abandoned write pass: no task may read the runs once the caller removes them
        cancel_and_wait(pending)


def write_slices(engine: Engine, runs: Sequence[Run], groups: Sequence[tuple[int, Sequence[Slice]]], *, key: str,
                 sink: Sink[R, Any], workers: int | None = None, local_reads: bool = True) -> Iterator[R]:
    """The write pass: per group (its ``key`` value and its slices of the runs), a Ray task hands the sink's
    ``write`` all its rows with an int64 ``key`` column in front (a group without rows is not written);
    ``workers`` tasks at once. Yields the tasks' results as they finish. ``local_reads=False`` sends every slice
    through the object store, as between nodes (tests run that path on one machine)."""
    import ray

    parallel = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    write = ray.remote(_write_slices)
    write_task = WriteTask(sink)
    runs_ref: Any = ray.put(list(runs))
    yield from _windowed(write, ((write_task, key, value, runs_ref, list(slices), local_reads)
                                 for value, slices in groups), parallel)


def _write_pieces(task: WriteTask[Any], key: str, value: int, runs: Sequence[Run],
                  pieces: Sequence[Sequence[Slice]], local_reads: bool) -> pa.Table:
    """One write task of ``write_pieces``: its group a piece at a time (the next piece's fetches under way)."""
    with arrow_pool():  # as in ``_spill_run``
        result = task.over(_gathered_pieces(key, value, runs, pieces, local_reads))
    pa.default_memory_pool().release_unused()
    return result


def _gathered_pieces(key: str, value: int, runs: Sequence[Run], pieces: Sequence[Sequence[Slice]],
                     local_reads: bool, remap_bytes: int = REMAP_BYTES) -> Iterator[pa.Table]:
    reader = _RunReader(runs, local_reads, remap_bytes)  # each local run opened once per remap_bytes sliced
    nothing: _Started = ([], [])
    upcoming = reader.start(pieces[0]) if pieces else nothing
    for number in range(len(pieces)):
        current = upcoming
        upcoming = reader.start(pieces[number + 1]) if number + 1 < len(pieces) else nothing
        keyed = reader.finish(current, key, value)
        del current
        if keyed:
            yield pa.concat_tables(keyed)
        del keyed


def write_pieces(engine: Engine, runs: Sequence[Run], groups: Iterable[tuple[int, Sequence[Sequence[Slice]]]], *,
                 key: str, sink: Sink[R, Any], workers: int | None = None, local_reads: bool = True) -> Iterator[R]:
    """``write_slices`` for groups larger than a task should hold: a group is (its ``key`` value, its pieces, each
    a list of slices of the runs), and its task hands the sink's ``write`` one batch per piece, gathered when the
    sink asks for it (a lazy iterable; the next piece's remote slices are fetched meanwhile), so the task holds
    about two pieces of its group at a time (and at most ``REMAP_BYTES`` of its local runs' pages mapped). A batch
    is a piece's rows of every run, with the ``key`` column in front; a piece without rows gives no batch. Yields
    the tasks' results as they finish."""
    import ray

    parallel = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    write = ray.remote(_write_pieces)
    write_task = WriteTask(sink)
    runs_ref: Any = ray.put(list(runs))
    yield from _windowed(write, ((write_task, key, value, runs_ref, [list(p) for p in pieces], local_reads)
                                 for value, pieces in groups), parallel)


def _remove(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def remove_runs(engine: Engine, runs: Sequence[Run], directory: str) -> None:
    """Remove ``directory`` on every node that holds a run (this node's too; best effort)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = _node()
    _remove(directory)
    others = sorted({run.node for run in runs} - {here})
    remove = ray.remote(_remove)
    refs = [remove.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True), num_cpus=0)
            .remote(directory) for node in others]
    ray.wait(refs, num_returns=len(refs), timeout=60)
