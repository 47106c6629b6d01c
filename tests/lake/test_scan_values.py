"""scan_batches(values_in=...): a lookup by key over a table's files reads only the row groups whose statistics may
hold a key, filters each batch at once, and returns what the dataset scanner's filter returned (lineage_events reads
one sample's events so since the dataset scanner's read-ahead made its memory depend on thread timing)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from datahub.lake.scan import scan_batches


def _table(start: int, rows: int, key_type: pa.DataType) -> pa.Table:
    keys = [f"{i:08x}" for i in range(start, start + rows)]  # sorted, as a lineage commit is by sample_id
    return pa.table({"sample_id": pa.array(keys, key_type), "n": pa.array(range(start, start + rows), pa.int64())})


def test_a_lookup_reads_only_row_groups_that_may_hold_a_key_and_equals_the_scanners_filter(tmp_path, monkeypatch):
    pq.write_table(_table(0, 4000, pa.string()), tmp_path / "a.parquet", row_group_size=1000)
    pq.write_table(_table(4000, 4000, pa.large_string()), tmp_path / "b.parquet", row_group_size=1000)
    dataset = ds.dataset([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")],
                         schema=_table(0, 0, pa.string()).schema)
    keys = [f"{i:08x}" for i in (5, 1500, 6999, 12345)]  # the last is in no file
    read: list[tuple[str, list[int]]] = []
    real = pq.ParquetFile.iter_batches

    def iter_batches(self, *args, **kwargs):
        read.append((self.metadata.row_group(0).column(0).statistics.min, kwargs["row_groups"]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    batches = list(scan_batches(dataset, values_in=("sample_id", keys), batch_rows=256))
    got = pa.Table.from_batches(batches, schema=dataset.schema)
    assert read == [("00000000", [0, 1]), ("00000fa0", [2])]  # file b: row group 2 holds 6999; 12345 is past its max
    assert all(b.num_rows <= 256 for b in batches) and got.schema == dataset.schema
    assert got.to_pylist() == dataset.to_table(filter=ds.field("sample_id").isin(keys)).to_pylist()
    assert got.column("n").to_pylist() == [5, 1500, 6999]


def test_a_lookup_of_other_columns_and_of_no_key(tmp_path):
    pq.write_table(_table(0, 3000, pa.string()), tmp_path / "a.parquet", row_group_size=1000)
    dataset = ds.dataset(str(tmp_path / "a.parquet"))
    batches = scan_batches(dataset, columns=["n"], values_in=("sample_id", ["000007d0"]))
    rows = [r for b in batches for r in b.to_pylist()]
    assert rows == [{"n": 2000}]  # filtered by a column it was not asked to return
    assert list(scan_batches(dataset, values_in=("sample_id", []))) == []
    with pytest.raises(KeyError, match="'id'"):
        list(scan_batches(dataset, values_in=("id", ["x"])))


def test_a_lookup_by_a_partition_column_a_null_value_and_values_of_another_type(tmp_path):
    table = _table(0, 300, pa.string()).append_column("part", pa.array(["a"] * 100 + ["b"] * 200))
    ds.write_dataset(table, tmp_path / "p", format="parquet", partitioning=["part"], partitioning_flavor="hive")
    dataset = ds.dataset(str(tmp_path / "p"), format="parquet", partitioning="hive")
    # a partition column's value is the file's: the whole file matches, or none of it (was: no rows at all)
    rows = [r for b in scan_batches(dataset, columns=["n"], values_in=("part", ["b"])) for r in b.to_pylist()]
    assert sorted(r["n"] for r in rows) == list(range(100, 300))
    assert list(scan_batches(dataset, values_in=("part", ["c"]))) == []
    # a null matches no row (SQL's IN), beside the values that do (was: TypeError from sorting None with str)
    got = [r["n"] for b in scan_batches(dataset, columns=["n"], values_in=("sample_id", [None, "00000005"]))
           for r in b.to_pylist()]
    assert got == [5]
    assert list(scan_batches(dataset, values_in=("sample_id", [None]))) == []
    with pytest.raises(TypeError, match=r"values_in on column 'n' \(int64\).*pass values of the column's type"):
        list(scan_batches(dataset, values_in=("n", ["five"])))


def test_reads_without_arrow_threads_give_the_same_batches(tmp_path):
    """use_threads=False (QA's 64-row reads: the thread pool cost more than the decode) changes no row or batch."""
    pq.write_table(_table(0, 3000, pa.string()), tmp_path / "a.parquet", row_group_size=1000)
    dataset = ds.dataset(str(tmp_path / "a.parquet"))
    threaded = list(scan_batches(dataset, batch_rows=64))
    alone = list(scan_batches(dataset, batch_rows=64, use_threads=False))
    assert [b.num_rows for b in alone] == [b.num_rows for b in threaded] and len(alone) > 40
    assert pa.Table.from_batches(alone).equals(pa.Table.from_batches(threaded))
