"""A pass of engine tasks that fails (a task raises) stops its other tasks before it raises, and the error names
the cause: the grouped write (``write_groups``: Spark's text export; the token export's passes are tested in
tests/export/test_token_engine_chunks.py), QA's ``map_reduce`` on Ray, a frame's read, ``map_batches`` stage and sink
write (Ray Data on Ray), Ray's hash shuffle, a Ray read its consumer closes, and a whole run on Ray.
A task left running keeps writing after its caller cleaned up (974f5e0 fixed the text export's passes the same way)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datahub.engines.sink import Sink
from datahub.operator import BatchOperator, register
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)
from tests.engines.task_locks import START_WAIT_S, assert_stopped, fail_once_running

ROUTED = pa.schema([("group", pa.int64()), ("value", pa.int64())])


@dataclass(frozen=True)
class _Rows:
    """A read task: one row for each of groups 0, 1, 2; in ``folder``, task ``failing`` raises once another runs."""

    folder: str | None = None

    def __call__(self, task: int) -> Iterator[pa.Table]:
        if self.folder is not None:
            fail_once_running(self.folder, task)
        yield pa.table({"group": pa.array([0, 1, 2], pa.int64()), "value": pa.array([task] * 3, pa.int64())},
                       schema=ROUTED)


@dataclass(frozen=True)
class _GroupSink(Sink[int, list]):
    """Writes a group (returns its key); in ``folder``, group 0 raises once another group's write runs."""

    folder: str | None = None

    def write(self, batches: Iterable[pa.Table]) -> int:
        group = int(pa.concat_tables(list(batches))["group"][0].as_py())
        if self.folder is not None:
            fail_once_running(self.folder, group)  # Spark may hand one worker two groups: it waits for the other's
        return group

    def commit(self, results: list) -> list:
        return sorted(results)


def _write_groups(engine: Any, read: _Rows, sink: _GroupSink) -> list[int]:
    import importlib

    write_groups = importlib.import_module(f"datahub.engines.{engine.name}.export").write_groups
    options = {"groups": 3} if engine.name == "ray" else {}
    return sorted(write_groups(engine, [0, 1, 2], read=read, key="group", sink=sink, routed_schema=ROUTED,
                               workers=2, **options))


@pytest.mark.parametrize("engine_name", ["ray", "spark"])
def test_a_failed_grouped_write_leaves_no_task_running(tmp_path: Path, request, engine_name: str) -> None:
    """The token export's shuffle: a read task, then a write task, fails while others run."""
    engine = request.getfixturevalue(f"{engine_name}_engine")
    assert _write_groups(engine, _Rows(), _GroupSink()) == [0, 1, 2]
    reads, writes = tmp_path / "reads", tmp_path / "writes"
    reads.mkdir(), writes.mkdir()
    with pytest.raises(Exception, match="task 0 fails"):
        _write_groups(engine, _Rows(str(reads)), _GroupSink())
    assert_stopped(reads)
    with pytest.raises(Exception, match="task 0 fails"):
        _write_groups(engine, _Rows(), _GroupSink(str(writes)))
    assert_stopped(writes)


@dataclass(frozen=True)
class _Map:
    """A map task: its item, and part p = (p, item) for each partition; in ``folder``, item 0 raises."""

    partitions: int
    folder: str | None = None

    def __call__(self, item: int) -> tuple[int, list[tuple[int, int]]]:
        if self.folder is not None:
            fail_once_running(self.folder, item)
        return item, [(p, item) for p in range(self.partitions)]


@dataclass(frozen=True)
class _Reduce:
    """A reduce task: (partition, the items it got); in ``folder``, partition 0 raises."""

    folder: str | None = None

    def __call__(self, parts: list[tuple[int, int]]) -> tuple[int, list[int]]:
        partition = parts[0][0]
        if self.folder is not None:
            fail_once_running(self.folder, partition)
        return partition, [item for _, item in parts]


def test_a_failed_map_or_reduce_task_of_qa_leaves_no_task_running(tmp_path: Path, ray_engine) -> None:
    """QA's aggregate pass on Ray (``map_reduce``): a map task, then a reduce task, fails while others run."""
    from datahub.engines.ray.tasks import map_reduce

    assert map_reduce(ray_engine, [0, 1, 2], _Map(3), _Reduce(), partitions=3, workers=2) == \
        ([0, 1, 2], [(p, [0, 1, 2]) for p in range(3)])
    maps, reduces = tmp_path / "maps", tmp_path / "reduces"
    maps.mkdir(), reduces.mkdir()
    with pytest.raises(ValueError, match="task 0 fails"):
        map_reduce(ray_engine, [0, 1, 2], _Map(3, str(maps)), _Reduce(), partitions=3, workers=2)
    assert_stopped(maps)
    with pytest.raises(ValueError, match="task 0 fails"):
        map_reduce(ray_engine, [0, 1, 2], _Map(3), _Reduce(str(reduces)), partitions=3, workers=2)
    assert_stopped(reduces)


@dataclass(frozen=True)
class _Tables:
    """A read of ``engine.read_files``: one small table per file; in ``folder``, file 0 raises once another runs."""

    folder: str

    def __call__(self, file: int) -> Iterator[pa.Table]:
        fail_once_running(self.folder, file)
        yield pa.table({"file": pa.array([file], pa.int64())})


@pytest.mark.parametrize("engine_name", ["ray", "spark"])
def test_a_failed_read_of_streamed_batches_leaves_no_task_running(tmp_path: Path, request, engine_name: str) -> None:
    """``engine.read_files(...).iter_batches()``: on Spark the count pass of the token export (which stages files on
    the tier from these tasks) and the summary pass of the text export; on Ray the ingest of a run (Ray Data; the
    token count pass runs through ``map_tasks`` since bbbc18e)."""
    engine = request.getfixturevalue(f"{engine_name}_engine")
    with pytest.raises(Exception, match="task 0 fails"):
        for _ in engine.read_files([0, 1, 2], _Tables(str(tmp_path))).iter_batches():
            pass
    assert_stopped(tmp_path)
    if engine_name == "ray":  # set on the engine's datasets only: a user's own Ray Data executions keep Ray's ways
        import ray.data

        from datahub.engines.ray.execution import StopTasksAtEnd

        assert StopTasksAtEnd not in ray.data.DataContext.get_current().custom_execution_callback_classes


@dataclass(frozen=True)
class _FileSink(Sink[list, list]):
    """Each task's write: the files in its rows; the write of file 0 raises once another file's write runs."""

    folder: str

    def write(self, batches: Iterable[pa.Table]) -> list:
        files = pa.concat_tables(list(batches))["file"].to_pylist()
        for file in files:
            fail_once_running(self.folder, file)
        return files

    def commit(self, results: list) -> list:
        return results


@dataclass(frozen=True)
class _Ones:
    def __call__(self, file: int) -> Iterator[pa.Table]:
        yield pa.table({"file": pa.array([file], pa.int64())})


@pytest.mark.parametrize("engine_name", ["ray", "spark"])
def test_a_failed_sink_write_leaves_no_task_running(tmp_path: Path, request, engine_name: str) -> None:
    """``Frame.write`` (the write seam's tasks: a run's table files, sinks): a task's write fails while another
    writes; the sink's abort must not run while that one still writes. On Ray a ``map_batches`` stage of Ray Data."""
    from datahub.engines.sink import write_frame

    engine = request.getfixturevalue(f"{engine_name}_engine")
    with pytest.raises(Exception, match="task 0 fails"):
        write_frame(engine.read_files([0, 1, 2], _Ones()), _FileSink(str(tmp_path)))
    assert_stopped(tmp_path)


@dataclass(frozen=True)
class _FailingMap:
    """A batch function of a graph node: file 0's batch raises once another file's batch is mapped."""

    folder: str

    def __call__(self, table: pa.Table) -> pa.Table:
        for file in table["file"].to_pylist():  # none on the driver's empty table (the schema of an empty frame)
            fail_once_running(self.folder, file)
        return table


def _consume(frame: Any, how: str) -> None:
    if how == "iter_batches":  # the run's sinks, the export's passes
        for _ in frame.iter_batches():
            pass
    else:  # a frame read by several branches, the input of a shuffle
        frame.materialize()


@pytest.mark.parametrize("how", ["iter_batches", "materialize"])
def test_a_failed_map_stage_on_ray_leaves_no_task_running(tmp_path: Path, ray_engine, how: str) -> None:
    """A graph node's ``map_batches`` on Ray (its own Ray Data stage over read blocks, not fused with the read)."""
    read = ray_engine.read_files([0, 1, 2], _Ones()).materialize()
    with pytest.raises(Exception, match="task 0 fails"):
        _consume(read.map_batches(_FailingMap(str(tmp_path)), name="failing"), how)
    assert_stopped(tmp_path)


@dataclass(frozen=True)
class _Holds:
    """A read in which files 0, 1 and 2 yield their table at once and every other file's task holds."""

    folder: str

    def __call__(self, file: int) -> Iterator[pa.Table]:
        if file > 2:
            fail_once_running(self.folder, file)
        yield pa.table({"file": pa.array([file], pa.int64())})


def test_a_ray_read_its_consumer_stops_leaves_no_task_running(tmp_path: Path, ray_engine) -> None:
    """The driver stops reading (its sink failed, a limit was reached) and closes the stream while reads run: they
    end before ``close`` returns. (Ray Data hands out the first batch once three blocks are in: files 0, 1, 2.)"""
    batches = ray_engine.read_files([0, 1, 2, 3, 4], _Holds(str(tmp_path))).iter_batches()
    assert next(batches)["file"].to_pylist() in ([0], [1], [2])
    deadline = time.monotonic() + START_WAIT_S
    while not list(tmp_path.glob("running-*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    batches.close()
    assert_stopped(tmp_path)


@dataclass(frozen=True)
class _FailingHaving:
    """A groupby's ``having`` (run in the shuffle's reduce tasks): the partition holding key 0 raises once another
    partition's reduce runs; the others hold."""

    folder: str

    def __call__(self, groups: pa.Table) -> pa.Table:
        keys = groups["key"].to_pylist()
        if keys:  # an empty partition, or the driver's schema of an empty frame
            fail_once_running(self.folder, 0 if 0 in keys else min(keys))
        return groups


def test_a_failed_reduce_of_a_ray_shuffle_leaves_no_task_running(tmp_path: Path, ray_engine) -> None:
    """``RayFrame.groupby_agg`` (dedup's band groups; ``join`` runs the same shuffle): a reduce task fails while
    another runs. The shuffle's tasks are plain Ray tasks, not Ray Data's."""
    table = pa.table({"key": pa.array(range(16), pa.int64()), "value": pa.array(range(16), pa.int64())})
    frame = ray_engine.from_arrow(table)
    groups = frame.groupby_agg(["key"], {"total": ("value", "sum")}).to_arrow()
    assert sorted(groups["key"].to_pylist()) == list(range(16))
    with pytest.raises(Exception, match="task 0 fails"):
        frame.groupby_agg(["key"], {"total": ("value", "sum")}, having=_FailingHaving(str(tmp_path))).to_arrow()
    assert_stopped(tmp_path)


@register
class FailOnceRunning(BatchOperator):
    """A graph operator: each document ``FOLDER|N`` runs ``fail_once_running(FOLDER, N)`` in its batch."""

    name = "test_fail_once_running"

    def process(self, table: pa.Table) -> pa.Table:
        for text in table.column("text").to_pylist():
            folder, task = text.rsplit("|", 1)
            fail_once_running(folder, int(task))
        return table


def test_a_failed_run_on_ray_leaves_no_task_running(tmp_path: Path, job_spec, ray_engine) -> None:
    """``run_job`` end to end: a graph node fails on one input file while another file's batch runs; when the run's
    error reaches the caller (its staged files cleaned up), no task of it still runs."""
    from datahub.pipeline.run import run_job

    locks, inputs = tmp_path / "locks", tmp_path / "in"
    locks.mkdir(), inputs.mkdir()
    for task in range(3):
        (inputs / f"{task}.jsonl").write_text(json.dumps({"text": f"{locks}|{task}"}) + "\n")
    spec = job_spec(inputs=[{"uri": str(inputs / "*.jsonl")}], lake_root=tmp_path / "lake",
                    graph={"hold": {"op": FailOnceRunning.name}, "samples": {"sink": "samples", "after": ["hold"]}})
    with pytest.raises(Exception, match="task 0 fails"):
        run_job(spec, engine=ray_engine)
    assert_stopped(locks)



@dataclass
class _DrainContext:
    """What ``drain_samples`` reads of a run's context: a ``--full`` run streams the rows to the driver's staging."""

    engine: Any
    lake: Any = None
    run_id: str = "run-1"
    full: bool = True

    def report(self, stage: str, done: int) -> None:
        pass


@dataclass
class _OnceReadsRun:
    """A frame whose first batch reaches the driver once one of ``frame``'s held reads runs (so a failure on it
    leaves reads running); it closes ``frame``'s stream only when it is itself closed."""

    frame: Any
    folder: Path

    def iter_batches(self) -> Iterator[pa.Table]:
        batches = self.frame.iter_batches()
        try:
            for batch in batches:
                deadline = time.monotonic() + START_WAIT_S
                while not list(self.folder.glob("running-*")) and time.monotonic() < deadline:
                    time.sleep(0.02)
                yield batch
        finally:
            batches.close()


def test_a_driver_side_write_failure_on_ray_leaves_no_task_running(tmp_path: Path, ray_engine) -> None:
    """The driver's own write of a run's stream fails (here on its first batch: the rows are not samples) while the
    graph's Ray reads run on: ``drain_samples`` closes the stream, so they end before the error reaches the caller,
    even while the caller still holds the error (its traceback references the stream)."""
    from datahub.pipeline.sinks.samples import drain_samples

    locks = tmp_path / "locks"
    locks.mkdir()
    frame = _OnceReadsRun(ray_engine.read_files([0, 1, 2, 3, 4], _Holds(str(locks))), locks)
    with pytest.raises(Exception) as failed:
        drain_samples(frame, _DrainContext(ray_engine), str(tmp_path / "staging"), {})  # type: ignore[arg-type]
    assert failed.value is not None  # held, as run_job holds it while it records the failed run
    assert_stopped(locks)
