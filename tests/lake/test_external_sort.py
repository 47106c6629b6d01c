"""SortedRuns: the first row of each key in key order, the same whether it fits in memory or spills many runs."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from datahub.lake import external_sort
from datahub.lake.external_sort import SortedRuns

SCHEMA = pa.schema([("key", pa.string()), ("position", pa.int64())])


def _rows(count: int, distinct_keys: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    keys = [f"id-{k:05d}" if k % 3 else f"{k:x}" for k in rng.integers(0, distinct_keys, count).tolist()]
    return pa.table({"key": keys, "position": np.arange(count)}, schema=SCHEMA)


def _expected(rows: pa.Table) -> list[tuple[str, int]]:
    first: dict[str, int] = {}
    for key, position in zip(rows.column("key").to_pylist(), rows.column("position").to_pylist()):
        first.setdefault(key, position)
    return sorted(first.items())


@pytest.mark.parametrize("run_rows, read_rows, fan_in", [(10_000, 500, 32), (700, 64, 32), (300, 50, 3)])
def test_first_row_of_each_key_in_order_spilled_or_not(tmp_path, monkeypatch, run_rows, read_rows, fan_in):
    monkeypatch.setattr(external_sort, "FAN_IN", fan_in)
    rows = _rows(5_000, 1_800, seed=run_rows)  # most keys repeat, across batches and runs
    with SortedRuns(SCHEMA, "key", run_rows=run_rows, read_rows=read_rows, directory=str(tmp_path)) as runs:
        for start in range(0, rows.num_rows, 250):
            runs.add(rows.slice(start, 250))
        assert (runs.spilled_runs > fan_in) == (run_rows == 300)
        assert (runs.spilled_runs == 0) == (run_rows == 10_000)
        blocks = list(runs.merged())
    assert max(b.num_rows for b in blocks) <= fan_in * read_rows
    merged = pa.concat_tables(blocks)
    assert list(zip(merged.column("key").to_pylist(), merged.column("position").to_pylist())) == _expected(rows)
    assert os.listdir(tmp_path) == []  # spill files removed on exit


def test_integer_keys_and_refused_nulls(tmp_path):
    schema = pa.schema([("hash", pa.uint64())])
    values = np.random.default_rng(3).integers(0, 2**63, 3_000, dtype=np.uint64) * np.uint64(2)
    with SortedRuns(schema, "hash", run_rows=400, read_rows=100, directory=str(tmp_path)) as runs:
        runs.add(pa.table({"hash": np.concatenate([values, values[:500]])}, schema=schema))
        merged = pa.concat_tables(runs.merged()).column("hash").to_numpy()
        assert np.array_equal(merged, np.unique(values))
        with pytest.raises(ValueError, match="nulls"):
            runs.add(pa.table({"hash": pa.array([1, None], pa.uint64())}))


@pytest.mark.parametrize("run_rows, read_rows, fan_in", [(10_000, 500, 32), (300, 16, 3)])
def test_order_column_keeps_smallest_and_every_row_sorts_by_key_then_order(tmp_path, monkeypatch, run_rows,
                                                                             read_rows, fan_in):
    monkeypatch.setattr(external_sort, "FAN_IN", fan_in)
    rows = _rows(4_000, 300, seed=11)  # ~13 rows a key: a key's rows span blocks and runs
    order = np.random.default_rng(5).permutation(rows.num_rows)  # added in an order unrelated to "position"
    shuffled = rows.take(pa.array(order))
    expected_all = sorted(zip(rows.column("key").to_pylist(), rows.column("position").to_pylist()))
    smallest: dict[str, int] = {}
    for key, position in expected_all:
        smallest.setdefault(key, position)
    for distinct, expected in ((True, sorted(smallest.items())), (False, expected_all)):
        with SortedRuns(SCHEMA, "key", order="position", distinct=distinct, run_rows=run_rows, read_rows=read_rows,
                        directory=str(tmp_path)) as runs:
            for start in range(0, shuffled.num_rows, 250):
                runs.add(shuffled.slice(start, 250))
            assert (runs.spilled_runs > fan_in) == (run_rows == 300)
            merged = pa.concat_tables(runs.merged())
        assert list(zip(merged.column("key").to_pylist(), merged.column("position").to_pylist())) == expected
    with pytest.raises(ValueError, match="distinct"):
        SortedRuns(SCHEMA, "key", counts="position", distinct=False)
