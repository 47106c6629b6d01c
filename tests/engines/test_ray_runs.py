"""Sorted runs on the workers' disks (datahub.engines.ray.export): the read pass spills, the write pass reads slices."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.engines.sink import Sink
from tests.engines.task_locks import assert_stopped, fail_once_running


@dataclass(frozen=True)
class _SortedNumbers:
    """A read task: the numbers ``task * 10 .. task * 10 + 9``, odd ones first then even (the run's order)."""

    def __call__(self, task: int) -> tuple[pa.Table, pa.Table]:
        values = [v for v in range(task * 10, task * 10 + 10) if v % 2] + [v for v in range(task * 10, task * 10 + 10)
                                                                           if not v % 2]
        rows = pa.table({"value": pa.array(values, pa.int64()), "payload": [f"row-{v}".encode() for v in values]})
        return rows, pa.table({"rows": [len(values)]})


@dataclass(frozen=True)
class _Collect(Sink[tuple[int, list[int], list[bytes]], list]):
    """Each write returns its group key and every value and payload it was given, in the order given."""

    def write(self, batches: Iterable[pa.Table]) -> tuple[int, list[int], list[bytes]]:
        table = pa.concat_tables(list(batches))
        assert table.column_names == ["group", "value", "payload"]
        keys = set(table["group"].to_pylist())
        assert len(keys) == 1
        return keys.pop(), table["value"].to_pylist(), table["payload"].to_pylist()

    def commit(self, results: list) -> list:
        return sorted(results)


@pytest.mark.parametrize("local_reads", [True, False])
def test_groups_get_their_slices_of_every_run_from_disk_or_through_the_object_store(tmp_path: Path, ray_engine,
                                                                                     local_reads: bool) -> None:
    from datahub.engines.ray.export import remove_runs, spill_runs, write_slices

    directory = str(tmp_path / "runs")
    spilled = list(spill_runs(ray_engine, [0, 1, 2], read=_SortedNumbers(), directory=directory, workers=2))
    runs = [run for run, _ in spilled]
    assert [summary["rows"].to_pylist() for _, summary in spilled] == [[10], [10], [10]]
    assert [run.rows for run in runs] == [10, 10, 10] and all(Path(run.path).is_file() for run in runs)
    # group 7: the odd values of every run; group 8: the even values of runs 0 and 2; group 9 has no rows: no write
    groups = [(7, [(0, 0, 5), (1, 0, 5), (2, 0, 5)]), (8, [(0, 5, 10), (2, 5, 10)]), (9, [])]
    results = sorted(write_slices(ray_engine, runs, groups, key="group", sink=_Collect(), workers=2,
                                  local_reads=local_reads))
    odd = [v for t in range(3) for v in range(t * 10, t * 10 + 10) if v % 2]
    even = [v for t in (0, 2) for v in range(t * 10, t * 10 + 10) if not v % 2]
    assert results == [(7, odd, [f"row-{v}".encode() for v in odd]), (8, even, [f"row-{v}".encode() for v in even])]
    remove_runs(ray_engine, runs, directory)
    assert not Path(directory).exists()


def test_a_run_is_sorted_as_the_reader_gave_it(tmp_path: Path, ray_engine) -> None:
    from datahub.engines.ray.export import spill_runs

    (run, _), = spill_runs(ray_engine, [4], read=_SortedNumbers(), directory=str(tmp_path), workers=1)
    with pa.memory_map(run.path) as source:
        values = pa.ipc.open_file(source).read_all()["value"]
    assert values.to_pylist() == [41, 43, 45, 47, 49, 40, 42, 44, 46, 48]
    assert pc.max(values).as_py() == 49


@dataclass(frozen=True)
class _FailingReader:
    folder: str

    def __call__(self, task: int) -> tuple[pa.Table, pa.Table]:
        fail_once_running(self.folder, task)
        return _SortedNumbers()(task)


@dataclass(frozen=True)
class _FailingSink(Sink[int, list]):
    folder: str

    def write(self, batches: Iterable[pa.Table]) -> int:
        group = pa.concat_tables(list(batches))["group"][0].as_py()
        fail_once_running(self.folder, group)
        return group

    def commit(self, results: list) -> list:
        return results


def test_a_failed_read_or_write_pass_leaves_no_task_running(tmp_path: Path, ray_engine) -> None:
    """A task failed while others ran: they went on after the export removed its runs (a failed Ray export left
    72 MB runs in the spill folder 15 s later). The pass now cancels its tasks in flight and waits for them."""
    from datahub.engines.ray.export import spill_runs, write_slices

    reads, writes = tmp_path / "reads", tmp_path / "writes"
    reads.mkdir(), writes.mkdir()
    with pytest.raises(ValueError, match="task 0 fails"):
        list(spill_runs(ray_engine, [0, 1, 2], read=_FailingReader(str(reads)), directory=str(tmp_path / "runs"),
                        workers=2))
    assert_stopped(reads)
    runs = [run for run, _ in spill_runs(ray_engine, [0, 1], read=_SortedNumbers(), directory=str(tmp_path / "runs"),
                                         workers=2)]
    with pytest.raises(ValueError, match="task 0 fails"):
        list(write_slices(ray_engine, runs, [(0, [(0, 0, 5)]), (1, [(1, 0, 5)]), (2, [(0, 5, 10)])], key="group",
                          sink=_FailingSink(str(writes)), workers=2))
    assert_stopped(writes)
