"""A Spark run's tables are written by the executors and committed once by the driver (add actions).

No rows of the graph output reach the driver: each task writes its partition's samples and
quarantine files into the tables' folders, lineage is range-sorted by sample_id on the
executors, and the runner commits every table once with the run id as app transaction.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.engines.spark.sink import write_split
from datahub.lake.files import ParquetTarget, file_prefix
from datahub.lake import Lake
from datahub.lake.lake import SORTED_LAYOUT
from datahub.pipeline.faults import KILL_AT_ENV
from datahub.pipeline.run import run_job
from datahub.pipeline.sinks.samples import WrittenSamples
from datahub.pipeline.sinks.split import SampleSplitter, SinkCounts, samples_schema
from tests.ceph import ceph_s3  # noqa: F401
from tests.pipeline.corpus import job_raw, make_corpus, run_cli, snapshot, write_job

SPARK = {"kind": "spark", "master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "4"}}


def _parquet_files(lake: Lake, table: str) -> set[str]:
    folder = lake.table_uri(table)
    return {os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".parquet")} if os.path.isdir(folder) else set()


def _referenced(lake: Lake, table: str) -> set[str]:
    return {u.removeprefix("file://") for u in lake.table(table).file_uris()}


def data_commits_with_txn(lake: Lake, table: str) -> list[str]:
    """The txn of every commit that added data files (schema and property commits excluded)."""
    return [h["datahub.txn"] for h in reversed(lake.history(table))
            if h.get("datahub.txn") and not h.get("datahub.schema_merge") and h.get("operation") != "SET TBLPROPERTIES"]


def _assert_lineage_sorted_in_ranges(lake: Lake) -> None:
    """Every lineage file is sorted by sample_id in row groups of at most 32k rows; files cover disjoint ranges."""
    column, group_rows = SORTED_LAYOUT["lineage"]
    ranges = []
    for uri in sorted(_referenced(lake, "lineage")):
        ids = pq.read_table(uri, columns=[column]).column(column).to_pylist()
        assert ids == sorted(ids), uri
        metadata = pq.ParquetFile(uri).metadata
        assert all(metadata.row_group(i).num_rows <= group_rows for i in range(metadata.num_row_groups))
        ranges.append((ids[0], ids[-1]))
    ranges.sort()
    assert all(left[1] < right[0] for left, right in zip(ranges, ranges[1:])), ranges


def test_spark_run_tables_are_written_by_executor_tasks(spark_engine, tmp_path):
    corpus = make_corpus(tmp_path / "corpus", files=3, per_file=30)  # + broken.jsonl: 4 input files
    spec = validate_job_spec({**job_raw(corpus, tmp_path / "lake", name="executors"), "engine": SPARK}, source="t.yaml")
    result = run_job(spec, engine=spark_engine)
    assert result.status == "succeeded", result.error
    lake = Lake(tmp_path / "lake")
    prefix = file_prefix(result.run_id)

    # one task per input file, one samples file per task, named by the executor writer
    samples_files = _referenced(lake, "samples")
    assert len(samples_files) == len(result.inputs) == 4
    assert all(os.path.basename(f).startswith(prefix + "-") for f in samples_files), samples_files
    assert _parquet_files(lake, "samples") == samples_files  # nothing written twice, nothing left over
    for table in ("quarantine", "lineage", "samples"):
        assert all(os.path.basename(f).startswith(prefix + "-") for f in _referenced(lake, table)), table
        assert data_commits_with_txn(lake, table) == [result.run_id]

    # accounting and content: the same as the in-process reference engine (rows on the driver)
    counts = result.counts
    assert counts["records_read"] == counts["samples_written"] + counts["dropped_total"] + counts["quarantined_total"]
    assert counts["samples_written"] == lake.read("samples").num_rows == 91 and counts["quarantined"] == {"invalid_json": 1}
    reference = run_job(validate_job_spec(job_raw(corpus, tmp_path / "reference", name="executors"), source="t.yaml"),
                        engine=ArrowEngine())
    assert reference.run_id == result.run_id and reference.counts == counts
    assert snapshot(Lake(tmp_path / "reference")) == snapshot(lake)
    _assert_lineage_sorted_in_ranges(lake)


@pytest.mark.parametrize("point", ["streaming", "after_commit:samples"])
def test_killed_spark_run_leaves_only_invisible_files_and_the_rerun_commits_once(point, spark_engine, tmp_path):
    corpus = make_corpus(tmp_path / "corpus", files=2, per_file=25)
    raw = {**job_raw(corpus, tmp_path / "lake", name="killed"), "engine": SPARK}
    job = write_job(tmp_path / "job.yaml", raw)
    killed = run_cli(["run", str(job)], env={KILL_AT_ENV: point}, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    lake = Lake(tmp_path / "lake")
    written = {table: _parquet_files(lake, table) for table in ("samples", "quarantine", "lineage")}
    assert all(written.values()), written  # the executors wrote every table's files before the kill
    if point == "streaming":  # nothing committed: no reader sees any of those files
        assert not any(lake.exists(table) for table in written)
    else:
        assert lake.exists("samples") and not lake.exists("quarantine") and not lake.exists("lineage")

    result = run_job(validate_job_spec(raw, source=str(job)), engine=spark_engine)
    assert result.status == "succeeded", result.error
    assert all(os.path.basename(f).startswith(file_prefix(result.run_id)) for files in written.values() for f in files)
    for table in ("samples", "quarantine", "lineage"):
        assert data_commits_with_txn(lake, table) == [result.run_id], table  # one commit per table and run
    if point == "streaming":
        for table, files in written.items():
            assert not files & _referenced(lake, table), table  # the killed run's files stay unreferenced
    else:  # samples was committed by the killed run: the re-run wrote no samples file again
        assert _parquet_files(lake, "samples") == _referenced(lake, "samples") == written["samples"]
        assert not written["lineage"] & _referenced(lake, "lineage")
    reference = run_job(validate_job_spec(job_raw(corpus, tmp_path / "reference", name="killed"), source=str(job)),
                        engine=ArrowEngine())
    assert snapshot(Lake(tmp_path / "reference")) == snapshot(lake)
    assert result.counts["samples_written"] == lake.read("samples").num_rows == 51


def _graph_output(n: int) -> pa.Table:
    """Rows as they reach a samples sink: live ones, some dropped, with the envelope columns."""
    ids = [f"{(i * 7919) % 100_003:08x}{i:024x}" for i in range(n)]
    dropped = ["too_short" if i % 5 == 0 else None for i in range(n)]
    return pa.table({
        "sample_id": ids,
        "text": [f"text {i}" for i in range(n)],
        "source_uri": ["mem://x"] * n,
        "source_offset": pa.array(range(n), pa.int64()),
        "source_format": ["jsonl"] * n,
        "_drop_reason": pa.array(dropped, pa.string()),
        "_drop_op": pa.array(["length_filter@1" if d else None for d in dropped], pa.string()),
        "_drop_ref": pa.nulls(n, pa.string()),
    })


def test_lineage_is_range_partitioned_and_sorted_on_the_executors(spark_engine, tmp_path):
    lake = Lake(tmp_path / "lake")
    frame = spark_engine.from_arrow(_graph_output(3000))
    splitter = SampleSplitter("sinkrun-000000000000", {}, write_ingested=True)
    split = write_split(frame, splitter.split, lake, run_id=splitter.run_id, samples_schema=samples_schema,
                        lineage_rows_per_file=1000)  # 3000 ingested + 600 dropped events
    counts = SinkCounts()
    for item in split.counts:
        counts.add(SinkCounts.from_json(item))
    written = WrittenSamples(counts, split.samples, split.quarantine, split.lineage)
    assert written.counts.as_dict()["records_read"] == 3000 and written.counts.dropped == {"too_short": 600}
    assert written.samples.rows == 2400 and written.lineage.rows == 3600 and not written.quarantine.files
    assert len(written.lineage.files) >= 3  # one file per sample_id range
    assert not lake.exists("samples")  # written, not committed
    for table, staged in (("samples", written.samples), ("lineage", written.lineage)):
        assert staged.commit(lake, table, txn=splitter.run_id) is not None
        version = lake.version(table)
        assert staged.commit(lake, table, txn=splitter.run_id) is None and lake.version(table) == version  # idempotent
    assert written.quarantine.commit(lake, "quarantine", txn=splitter.run_id) is None  # nothing staged, nothing asked
    _assert_lineage_sorted_in_ranges(lake)
    lineage = lake.read("lineage")
    assert lineage.num_rows == 3600 and set(lineage.column("action").to_pylist()) == {"ingested", "dropped"}
    live = [sample_id for i, sample_id in enumerate(_graph_output(3000).column("sample_id").to_pylist()) if i % 5]
    assert sorted(lake.read("samples").column("sample_id").to_pylist()) == sorted(live)


def test_parquet_target_buffers_rows_into_full_row_groups(tmp_path):
    schema = pa.schema([("sample_id", pa.string())])
    file = ParquetTarget(str(tmp_path), schema, prefix="t", row_group_rows=100).open()
    for start in range(0, 315, 45):  # seven writes of 45 rows
        file.write(pa.table({"sample_id": [f"{i:04d}" for i in range(start, start + 45)]}))
    description = file.close()
    assert description is not None and description["rows"] == 315
    metadata = pq.ParquetFile(description["uri"]).metadata
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [100, 100, 100, 15]
    assert json.loads(description["stats"])["minValues"] == {"sample_id": "0000"}
    assert ParquetTarget(str(tmp_path / "empty"), schema).open().close() is None  # no rows, no file
    assert not Path(tmp_path / "empty").exists()


@pytest.mark.ceph
def test_spark_run_into_a_ceph_lake(spark_engine, ceph_s3, tmp_path):  # noqa: F811
    bucket = ceph_s3.new_bucket("spark-run")
    options = ceph_s3.storage_options()
    corpus = make_corpus(tmp_path / "corpus", files=2, per_file=10)
    raw = {**job_raw(corpus, f"s3://{bucket}/lake", name="sparks3", storage_options=options), "engine": SPARK}
    result = run_job(validate_job_spec(raw, source="t.yaml"), engine=spark_engine)
    assert result.status == "succeeded", result.error
    lake = Lake(f"s3://{bucket}/lake", storage_options=options)
    files = lake.table("samples").file_uris()
    assert len(files) == 3 and all(u.startswith(f"s3://{bucket}/lake/samples/{file_prefix(result.run_id)}-") for u in files)
    assert lake.read("samples").num_rows == result.counts["samples_written"] == 21
    assert data_commits_with_txn(lake, "lineage") == [result.run_id]
    assert run_job(validate_job_spec(raw, source="t.yaml"), engine=spark_engine).status == "skipped"
