"""Executors write Parquet, the driver commits it as Delta add actions: idempotent per txn, no jars."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

from datahub.errors import LakeError
from datahub.lake.add_actions import DataFile, commit_files, commit_frame, relative_path
from datahub.lake.lake import Lake
from tests.ceph import ceph_s3  # noqa: F401


def _docs(n: int, start: int = 0) -> pa.Table:
    return pa.table({
        "sample_id": [f"id{i:04d}" for i in range(start, start + n)],
        "text": [f"document number {i}" for i in range(start, start + n)],
        "quality": pa.array([{"score": i / 10} for i in range(start, start + n)]),
        "_ev.norm": pa.array(["modified"] * n),
    })


def test_frame_written_by_executors_commits_once_per_txn(spark_engine, tmp_path):
    lake = Lake(tmp_path / "lake")
    frame = spark_engine.from_arrow(_docs(50)).map_batches(lambda t: t.drop_columns(["_ev.norm"]), name="strip")
    version = commit_frame(lake, "samples", frame, txn="run-1", metadata={"datahub.run_id": "run-1"})
    assert version is not None
    table = lake.table("samples")
    files = table.file_uris()
    assert len(files) >= 2 and all(os.path.dirname(f) == lake.table_uri("samples") for f in files)  # one per partition
    back = lake.read("samples").sort_by("sample_id")
    assert back.to_pylist() == _docs(50).drop_columns(["_ev.norm"]).to_pylist()
    assert table.transaction_version("run-1") == 1
    assert lake.schema_version("samples") is not None
    # the same txn again: no new version, no new files
    assert commit_frame(lake, "samples", frame, txn="run-1") is None
    assert lake.table("samples").version() == table.version() and sorted(lake.table("samples").file_uris()) == sorted(files)
    assert len([n for n in os.listdir(lake.table_uri("samples")) if n.endswith(".parquet")]) == len(files)
    # a new txn appends
    more = spark_engine.from_arrow(_docs(10, start=50).drop_columns(["_ev.norm"]))
    assert commit_frame(lake, "samples", more, txn="run-2") == table.version() + 1
    assert lake.read("samples").num_rows == 60


def test_stats_let_readers_skip_files(spark_engine, tmp_path):
    lake = Lake(tmp_path / "lake")
    frame = spark_engine.from_arrow(_docs(40).drop_columns(["_ev.norm"]))
    files = frame.write_parquet(lake.table_uri("samples"), prefix="part-t")
    assert sum(f.rows for f in files) == 40 and all(f.size > 0 for f in files)
    stats = [json.loads(f.stats) for f in files]
    assert sum(s["numRecords"] for s in stats) == 40
    assert min(s["minValues"]["sample_id"] for s in stats) == "id0000" and max(s["maxValues"]["sample_id"] for s in stats) == "id0039"
    commit_files(lake, "samples", files, schema=frame.delta_schema(), txn="t1")
    actions = pa.table(lake.table("samples").get_add_actions(flatten=True)).to_pylist()
    assert sorted(a["num_records"] for a in actions) == sorted(f.rows for f in files)
    import pyarrow.dataset as ds

    hit = lake.table("samples").to_pyarrow_dataset().to_table(filter=ds.field("sample_id") == "id0003")
    assert hit.num_rows == 1


def test_new_columns_and_struct_fields_reach_the_table_schema(spark_engine, tmp_path):
    """create_write_transaction keeps a table's schema, so files bringing new fields merge it first."""
    lake = Lake(tmp_path / "lake")
    first = _docs(4).drop_columns(["_ev.norm"])
    assert commit_frame(lake, "samples", spark_engine.from_arrow(first), txn="run-1") is not None
    later = pa.table({
        "sample_id": ["id9000"],
        "text": ["a later document"],
        "quality": pa.array([{"score": 0.5, "words": 3}]),  # a new struct field
        "lang": ["en"],  # a new column
    })
    version = commit_frame(lake, "samples", spark_engine.from_arrow(later), txn="run-2")
    assert version is not None and lake.applied("samples", "run-2")
    back = {row["sample_id"]: row for row in lake.read("samples").to_pylist()}
    assert back["id9000"]["lang"] == "en" and back["id9000"]["quality"] == {"score": 0.5, "words": 3}
    assert back["id0001"]["lang"] is None and back["id0001"]["quality"] == {"score": 0.1, "words": None}
    assert commit_frame(lake, "samples", spark_engine.from_arrow(later), txn="run-2") is None  # still idempotent
    assert lake.read("samples").num_rows == 5


def test_files_outside_the_table_folder_are_refused(tmp_path):
    lake = Lake(tmp_path / "lake")
    with pytest.raises(LakeError, match="inside its table folder"):
        commit_files(lake, "samples", [DataFile(uri=str(tmp_path / "elsewhere.parquet"), size=1, rows=1)],
                     schema=pa.schema([("a", pa.int64())]), txn="x")
    assert relative_path("s3://b/lake/samples", "s3://b/lake/samples/part-1.parquet") == "part-1.parquet"
    assert not lake.exists("samples")


def test_executors_write_to_ceph_s3(spark_engine, ceph_s3):  # noqa: F811
    ceph = ceph_s3
    bucket = ceph.new_bucket("spark-add-actions")
    lake = Lake(f"s3://{bucket}/lake", storage_options=ceph.storage_options())
    frame = spark_engine.from_arrow(_docs(30).drop_columns(["_ev.norm"]))
    assert commit_frame(lake, "samples", frame, txn="s3-run") is not None
    assert commit_frame(lake, "samples", frame, txn="s3-run") is None
    assert sorted(lake.read("samples").column("sample_id").to_pylist()) == [f"id{i:04d}" for i in range(30)]
