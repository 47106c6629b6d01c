"""``datahub inspect TABLE`` counts rows per kind from the Delta log's per-file statistics where a data file holds
one kind (min == max, or only nulls: text), and reads the ``kind`` column of the other files only: before, every data
file was read (8,000+ requests for a table of 4,000 files on S3, on every ``inspect samples``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datahub.kinds.names import DEFAULT_KIND, KIND_COLUMN
from datahub.lake import Lake
from datahub.lake.describe import describe_lake
from datahub.lake.scan import scan_batches
from tests.release.helpers import sample_rows

REPO = Path(__file__).resolve().parents[2]
# one commit (one data file) each: one kind, one kind and nulls, only nulls, two kinds, two kinds and nulls
FILES = [["chat"] * 4, ["preference"] * 2, ["chat", None, "chat"], [None, None], ["chat", "trajectory", "chat"],
         ["image_text", None, "preference"], ["image_text"] * 3]
MIXED = {4, 5}  # the files whose rows must be read


def _lake(root: Path) -> tuple[Lake, list[str]]:
    """The table and the data file of each commit, in ``FILES`` order."""
    lake = Lake(root)
    paths: list[str] = []
    for index, kinds in enumerate(FILES):
        rows = sample_rows([f"file {index} document {i}" for i in range(len(kinds))], "a.jsonl")
        lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(kinds, pa.string())),
                    txn=f"job-{index:012x}")
        new = set(pa.table(lake.table("samples").get_add_actions(flatten=True)).column("path").to_pylist())
        (added,) = new - set(paths)
        paths.append(added)
    return lake, paths


def _scanned(lake: Lake) -> dict[str, int]:
    """Rows per kind from every row's kind column (what inspect showed before)."""
    counts: dict[str, int] = {}
    for batch in scan_batches(lake.dataset("samples"), columns=[KIND_COLUMN]):
        for entry in pc.value_counts(pc.fill_null(batch.column(0), DEFAULT_KIND)).to_pylist():
            counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def test_inspect_counts_kinds_from_file_statistics_and_reads_only_mixed_files(tmp_path):
    lake, paths = _lake(tmp_path / "lake")
    expected = _scanned(lake)
    assert expected == {"chat": 8, "image_text": 4, "preference": 3, "text": 4, "trajectory": 1}
    # every single-kind file is made unreadable: the counts must come from the Delta log for them
    table_dir = Path(lake.table_uri("samples"))
    for index, path in enumerate(paths):
        if index not in MIXED:
            (table_dir / path).write_bytes(b"not parquet any more")
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert info["kinds"] == expected and list(info["kinds"]) == list(expected)  # same counts, same order
    done = subprocess.run([sys.executable, "-m", "datahub.cli.main", "inspect", "--lake", lake.root, "samples",
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tables"]["samples"]["kinds"] == expected


def test_a_mixed_file_is_still_read(tmp_path):
    """A file of two kinds cannot be counted from min/max: breaking it breaks the count (it is read)."""
    lake, paths = _lake(tmp_path / "lake")
    (Path(lake.table_uri("samples")) / paths[4]).write_bytes(b"not parquet any more")
    try:
        describe_lake(lake, "samples")
    except Exception as error:  # noqa: BLE001 - pyarrow's or the lake's error: either says the file was read
        assert "parquet" in str(error).lower() or paths[4] in str(error), error
    else:
        raise AssertionError("a mixed file was counted without being read")


def test_a_table_with_deletion_vectors_is_counted_without_its_deleted_rows(tmp_path):
    """A file's ``numRecords`` and null counts include the rows its deletion vector deletes (Spark/Databricks DELETE
    with ``delta.enableDeletionVectors``): 4 'chat' rows, 2 of them deleted, were counted as 4 from the log (and a
    file of several kinds could not be read at all: delta-rs refuses the table). The vectors are read and applied:
    a one-kind file from its statistics less its deleted rows (its data file is not read), a mixed file from its
    kind column with the deleted positions left out; the version before the delete counts every row."""
    from datahub.lake.describe import kind_counts
    from tests.lake.deletion_vectors import delete_rows

    lake = Lake(tmp_path / "one")
    rows = sample_rows([f"doc {i}" for i in range(4)], "a.jsonl")
    lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(["chat"] * 4, pa.string())), txn="job-000000000001")
    delete_rows(lake, "samples", [1, 2])
    (path,) = pa.table(lake.table("samples").get_add_actions(flatten=True)).column("path").to_pylist()
    (Path(lake.table_uri("samples")) / unquote(path)).write_bytes(b"not parquet any more")  # counted from the log
    assert kind_counts(lake, "samples") == {"chat": 2}
    assert kind_counts(lake, "samples", 0) == {"chat": 4}

    lake = Lake(tmp_path / "mixed")
    kinds = ["chat", None, "preference", "chat", None, "chat"]
    rows = sample_rows([f"doc {i}" for i in range(len(kinds))], "a.jsonl")
    lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(kinds, pa.string())), txn="job-000000000001")
    delete_rows(lake, "samples", [0, 1, 5])
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert info["kinds"] == {"chat": 1, "preference": 1, "text": 1} and info["rows"] == 3, info


def test_kinds_are_unknown_only_where_a_vector_that_must_be_read_cannot_be(tmp_path):
    """A file of one kind is counted from its vector's cardinality in the log, so a vector file that is missing does
    not matter; a file of several kinds needs its deleted positions: kinds unknown with the reason (an
    UnreadableVectors from kind_counts), never the log's over-count, while rows stay known (the cardinality)."""
    from datahub.lake.describe import UnreadableVectors, kind_counts
    from tests.lake.deletion_vectors import delete_rows

    lake = Lake(tmp_path / "one")
    rows = sample_rows([f"doc {i}" for i in range(4)], "a.jsonl")
    lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(["chat"] * 4, pa.string())), txn="job-000000000001")
    delete_rows(lake, "samples", [1, 2], inline=False)
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert (info["kinds"], info["rows"]) == ({"chat": 2}, 2), info

    lake = Lake(tmp_path / "mixed")
    rows = sample_rows([f"doc {i}" for i in range(4)], "a.jsonl")
    kinds = pa.array(["chat", "preference", "chat", None], pa.string())
    lake.commit("samples", rows.append_column(KIND_COLUMN, kinds), txn="job-000000000001")
    delete_rows(lake, "samples", [1, 2], inline=False)
    with pytest.raises(UnreadableVectors, match="samples: the table has deletion vectors .* could not be read: "):
        kind_counts(lake, "samples")
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert info["kinds"] is None and info["rows"] == 2, info
    assert info["kinds_unknown"].startswith("the table has deletion vectors"), info


def test_a_table_partitioned_by_kind_is_counted_from_its_partition_values_without_reading_a_file(tmp_path):
    """A null partition value (``__HIVE_DEFAULT_PARTITION__``) is text; every data file is made unreadable, so the
    counts come from the log's partition values alone."""
    from datahub.lake.describe import kind_counts

    lake = Lake(tmp_path / "lake")
    kinds = ["chat", None, "image_text", "chat", None, "trajectory", "chat"]
    rows = sample_rows([f"doc {i}" for i in range(len(kinds))], "a.jsonl")
    lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(kinds, pa.string())), txn="job-000000000001",
                partition_by=[KIND_COLUMN])
    expected = {"chat": 3, "text": 2, "image_text": 1, "trajectory": 1}
    assert _scanned(lake) == expected
    paths = pa.table(lake.table("samples").get_add_actions(flatten=True)).column("path").to_pylist()
    assert len(paths) == 4
    for path in paths:
        (Path(lake.table_uri("samples")) / unquote(path)).write_bytes(b"not parquet any more")
    counts = kind_counts(lake, "samples")
    assert counts == expected and list(counts) == list(expected)


def _external_add(lake: Lake, path: str, rows: pa.Table, stats: dict | None) -> None:
    """Commit a data file another writer wrote (``path`` relative to the table; the log URL-escapes it)."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    uri = lake.table_uri("samples")
    local = Path(uri) / path
    local.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, local)
    table = DeltaTable(uri)
    table.create_write_transaction([AddAction(path, local.stat().st_size, {}, 1_765_000_000_000, True,
                                              json.dumps(stats) if stats else "")],
                                   mode="append", schema=table.schema())


def test_a_file_committed_without_statistics_under_an_escaped_path_is_read(tmp_path):
    """The log spells the path URL-escaped (``spark%20out/...``), the scan decoded; the file without statistics is read
    (its kinds counted), the file with statistics is not (made unreadable)."""
    from datahub.lake.describe import kind_counts

    lake = Lake(tmp_path / "lake")
    rows = sample_rows([f"doc {i}" for i in range(3)], "a.jsonl")
    lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(["chat"] * 3, pa.string())), txn="job-000000000001")
    _external_add(lake, "spark out/part-1.parquet", sample_rows([f"other {i}" for i in range(4)], "b.jsonl")
                  .append_column(KIND_COLUMN, pa.array(["chat", "trajectory", None, "preference"], pa.string())), None)
    expected = {"chat": 4, "preference": 1, "text": 1, "trajectory": 1}
    assert _scanned(lake) == expected
    logged = pa.table(lake.table("samples").get_add_actions(flatten=True)).column("path").to_pylist()
    assert "spark%20out/part-1.parquet" in logged
    (first,) = [p for p in logged if "spark" not in p]
    (Path(lake.table_uri("samples")) / first).write_bytes(b"not parquet any more")
    assert kind_counts(lake, "samples") == expected


def test_equal_statistics_of_a_truncating_writer_are_not_taken_for_one_kind(tmp_path):
    """A writer that truncates string statistics to 32 characters without a tie-breaker shows min == max for a file
    of two kinds sharing a 32-character prefix: that file is read, not counted as 3 rows of the prefix."""
    from datahub.lake.describe import STATS_PREFIX_CHARS, kind_counts

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", sample_rows(["x"], "a").append_column(KIND_COLUMN, pa.array(["chat"])),
                txn="job-000000000001")
    prefix = "p" * STATS_PREFIX_CHARS
    alpha, beta = prefix + "_alpha", prefix + "_beta"
    _external_add(lake, "ext.parquet", sample_rows(["y1", "y2", "y3"], "b").append_column(
        KIND_COLUMN, pa.array([alpha, beta, beta])), {"numRecords": 3, "minValues": {KIND_COLUMN: prefix},
                                                        "maxValues": {KIND_COLUMN: prefix},
                                                        "nullCount": {KIND_COLUMN: 0}})
    assert kind_counts(lake, "samples") == {beta: 2, "chat": 1, alpha: 1}


def test_a_table_with_the_deletion_vectors_feature_but_no_vector_yet_is_counted(tmp_path):
    """Databricks' default for new tables (or a table after REORG PURGE): the protocol lists the deletionVectors
    reader feature, no file has a vector. delta-rs refuses to scan such a table, so a file of several kinds is read
    on its own as with vectors; `datahub inspect TABLE` raised DeltaProtocolError."""
    import json

    lake = Lake(tmp_path / "lake")
    rows = sample_rows([f"doc {i}" for i in range(4)], "a.jsonl")
    lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(["chat", None, "preference", "chat"], pa.string())),
                txn="job-000000000001")
    log = Path(lake.table_uri("samples")) / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json"))
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"]}
    (log / f"{version + 1:020d}.json").write_text(json.dumps({"protocol": protocol}) + "\n" + json.dumps(
        {"commitInfo": {"timestamp": 1_765_000_000_000, "operation": "SET TBLPROPERTIES"}}) + "\n")
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert info["kinds"] == {"chat": 2, "preference": 1, "text": 1} and info["rows"] == 4, info
    assert "deleted_rows" not in info or info["deleted_rows"] == 0, info


def _feature_commit(lake: Lake) -> None:
    """The deletionVectors reader feature, no vector: delta-rs refuses to scan, so files are read one by one."""
    log = Path(lake.table_uri("samples")) / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json"))
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"]}
    (log / f"{version + 1:020d}.json").write_text(json.dumps({"protocol": protocol}) + "\n" + json.dumps(
        {"commitInfo": {"timestamp": 1_765_000_000_000, "operation": "SET TBLPROPERTIES"}}) + "\n")


def test_a_file_read_on_its_own_takes_its_kind_from_its_partition_or_its_physical_column_name(tmp_path):
    """A file read on its own (a table delta-rs cannot scan) was counted as all text when its file has no 'kind'
    column: a partition column is not in the file (a file of a table partitioned by kind, committed without
    numRecords), and under column mapping (Databricks, name mode) the column is stored as its physical name."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    lake = Lake(tmp_path / "partitioned")
    rows = sample_rows([f"doc {i}" for i in range(3)], "a.jsonl")
    lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(["chat", None, "chat"], pa.string())),
                txn="job-000000000001", partition_by=[KIND_COLUMN])
    uri = lake.table_uri("samples")
    local = Path(uri) / "kind=preference" / "external.parquet"
    local.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(sample_rows([f"other {i}" for i in range(4)], "b.jsonl"), local)  # no kind column: a partition
    table = DeltaTable(uri)
    table.create_write_transaction([AddAction("kind=preference/external.parquet", local.stat().st_size,
                                              {KIND_COLUMN: "preference"}, 1_765_000_000_000, True, "")],
                                   mode="append", schema=table.schema(), partition_by=[KIND_COLUMN])
    _feature_commit(lake)
    assert describe_lake(lake, "samples")["tables"]["samples"]["kinds"] == {"preference": 4, "chat": 2, "text": 1}

    root = tmp_path / "mapped" / "samples"
    (root / "_delta_log").mkdir(parents=True)
    pq.write_table(pa.table({"col-a1": ["s1", "s2", "s3", "s4"], "col-k2": ["chat", None, "preference", "chat"]}),
                   root / "part-0.parquet")

    def field(name: str, physical: str, number: int) -> dict:
        return {"name": name, "type": "string", "nullable": True,
                "metadata": {"delta.columnMapping.id": number, "delta.columnMapping.physicalName": physical}}

    schema = {"type": "struct", "fields": [field("sample_id", "col-a1", 1), field(KIND_COLUMN, "col-k2", 2)]}
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["columnMapping", "deletionVectors"],
                      "writerFeatures": ["columnMapping", "deletionVectors"]}},
        {"metaData": {"id": "mapped", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema),
                      "partitionColumns": [], "createdTime": 1_765_000_000_000,
                      "configuration": {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "2"}}},
        {"add": {"path": "part-0.parquet", "partitionValues": {}, "size": (root / "part-0.parquet").stat().st_size,
                 "modificationTime": 1_765_000_000_000, "dataChange": True}},
        {"commitInfo": {"timestamp": 1_765_000_000_000, "operation": "WRITE"}},
    ]
    (root / "_delta_log" / f"{0:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    info = describe_lake(Lake(tmp_path / "mapped"), "samples")["tables"]["samples"]
    assert info["kinds"] == {"chat": 2, "preference": 1, "text": 1}, info


def test_a_vector_that_disagrees_with_the_log_leaves_the_kinds_unknown_not_inspect_failing(tmp_path):
    """A mixed file's decoded vector deletes other than the log's ``cardinality`` says: that table's kinds are
    unknown with both numbers, and the rest of `inspect` is shown (a plain LakeError stopped it)."""
    from tests.lake.deletion_vectors import delete_rows

    lake = Lake(tmp_path / "lake")
    rows = sample_rows([f"doc {i}" for i in range(4)], "a.jsonl")
    kinds = pa.array(["chat", "preference", "chat", None], pa.string())
    lake.commit("samples", rows.append_column(KIND_COLUMN, kinds), txn="job-000000000001")
    delete_rows(lake, "samples", [1, 2])
    last = max((Path(lake.table_uri("samples")) / "_delta_log").glob("*.json"))
    last.write_text(last.read_text().replace('"cardinality": 2', '"cardinality": 3'))
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert info["kinds"] is None and info["rows"] == 1, info
    assert "deletes 2 rows, the log says 3" in info["kinds_unknown"], info
    done = subprocess.run([sys.executable, "-m", "datahub.cli.main", "inspect", "samples", "--lake", lake.root],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0 and "the log says 3" in done.stdout, (done.stdout, done.stderr)
