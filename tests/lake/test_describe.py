"""``describe_lake`` / ``datahub inspect``: per-kind counts of a table with a ``kind`` column (README walkthrough)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from datahub.lake import Lake
from datahub.lake.describe import describe_lake
from tests.ceph import ceph_s3  # noqa: F401
from tests.release.helpers import sample_rows

REPO = Path(__file__).resolve().parents[2]


def _lake_of_kinds(root: Path) -> Lake:
    """samples: 3 chat rows, 1 preference row, 2 rows of null kind (text), in two commits (two files)."""
    lake = Lake(root)
    kinds = ["chat", "chat", None, "preference", "chat", None]
    rows = sample_rows([f"document {i}" for i in range(len(kinds))], "a.jsonl")
    rows = rows.append_column("kind", pa.array(kinds, pa.string()))
    lake.commit("samples", rows.slice(0, 3), txn="job-aaaaaaaaaaaa")
    lake.commit("samples", rows.slice(3), txn="job-bbbbbbbbbbbb")
    return lake


def test_one_table_with_a_kind_column_is_described_with_its_rows_per_kind(tmp_path):
    lake = _lake_of_kinds(tmp_path / "lake")
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert info["kinds"] == {"chat": 3, "preference": 1, "text": 2}
    assert sum(info["kinds"].values()) == info["rows"]
    # the whole-lake overview stays on the Delta log; a table without a kind column has no counts
    assert "kinds" not in describe_lake(lake)["tables"]["samples"]
    lake.commit("runs_like", pa.table({"run_id": ["r1"]}), txn="job-cccccccccccc")
    assert "kinds" not in describe_lake(lake, "runs_like")["tables"]["runs_like"]


def test_inspect_prints_the_rows_per_kind_in_text_and_json(tmp_path):
    lake = _lake_of_kinds(tmp_path / "lake")

    def inspect(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "datahub.cli.main", "inspect", "--lake", lake.root, "samples",
                               *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert json.loads(inspect("--json"))["tables"]["samples"]["kinds"] == {"chat": 3, "preference": 1, "text": 2}
    text = inspect()
    assert "kinds" in text
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "chat: 3" in lines and "preference: 1" in lines and "text: 2" in lines


def test_rows_of_a_table_with_deletion_vectors_do_not_count_the_deleted_rows(tmp_path):
    """A file's numRecords counts the rows its deletion vector deletes: 6 rows, 2 deleted by Spark's DELETE with
    deletion vectors, were reported as 6. The vectors are read (small: a bitmap per file) and the deleted rows taken
    off; the version before the delete still counts 6."""
    from tests.lake.deletion_vectors import delete_rows

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", sample_rows([f"document {i}" for i in range(6)], "a.jsonl"), txn="job-aaaaaaaaaaaa")
    delete_rows(lake, "samples", [1, 4])
    assert describe_lake(lake)["tables"]["samples"]["rows"] == 4
    detail = describe_lake(lake, "samples")["tables"]["samples"]
    assert detail["rows"] == 4 and detail["deleted_rows"] == 2, detail
    assert describe_lake(lake, "samples")["tables"]["samples"]["history"][0]["operation"] == "DELETE"


def test_rows_of_a_table_with_deletion_vectors_come_from_the_log_without_reading_a_vector(tmp_path, monkeypatch):
    """Rows are Σ numRecords − Σ deletionVector.cardinality from the log's add actions: no vector is decoded
    (deltalake's ``deletion_vectors()`` holds a flag per row of every file with a vector: `datahub inspect` grew with
    the table's rows). A vector kept in a file that is missing still gives the rows; so does a log whose commits
    before a checkpoint are gone (the cardinality read from the checkpoint)."""
    from deltalake import DeltaTable

    from tests.lake.deletion_vectors import delete_rows

    def no_decoding(self, *args, **kwargs):
        raise AssertionError("a deletion vector was decoded to count rows")

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", sample_rows([f"document {i}" for i in range(6)], "a.jsonl"), txn="job-aaaaaaaaaaaa")
    delete_rows(lake, "samples", [1, 4], inline=False)  # its vector file does not exist
    monkeypatch.setattr(DeltaTable, "deletion_vectors", no_decoding)
    info = describe_lake(lake)["tables"]["samples"]
    assert (info["rows"], info["deleted_rows"], info.get("rows_unknown")) == (4, 2, None), info
    done = subprocess.run([sys.executable, "-m", "datahub.cli.main", "inspect", "--lake", lake.root], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "unknown" not in done.stdout, done.stdout

    lake = Lake(tmp_path / "checkpointed")
    lake.commit("samples", sample_rows([f"document {i}" for i in range(6)], "a.jsonl"), txn="job-aaaaaaaaaaaa")
    delete_rows(lake, "samples", [0, 2, 5])
    lake.table("samples").create_checkpoint()
    log = Path(lake.table_uri("samples")) / "_delta_log"
    for commit in log.glob("*.json"):  # as a log cleanup after the checkpoint leaves it
        commit.unlink()
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert (info["rows"], info["deleted_rows"]) == (3, 3), info


def test_rows_with_deletion_vectors_on_ceph_s3_come_from_the_log(tmp_path, monkeypatch, ceph_s3):  # noqa: F811
    """The log is listed and read through the lake's s3:// filesystem (real RGW), still without decoding a vector."""
    from deltalake import DeltaTable

    from tests.lake.deletion_vectors import delete_rows

    local = Lake(tmp_path / "lake")
    local.commit("samples", sample_rows([f"document {i}" for i in range(6)], "a.jsonl"), txn="job-aaaaaaaaaaaa")
    delete_rows(local, "samples", [1, 4], inline=False)
    bucket = ceph_s3.new_bucket("describe-dv")
    ceph_s3.filesystem().put(str(tmp_path / "lake" / "samples"), f"{bucket}/lake/samples", recursive=True)
    monkeypatch.setattr(DeltaTable, "deletion_vectors", lambda self, *a, **k: (_ for _ in ()).throw(AssertionError))
    lake = Lake(f"s3://{bucket}/lake", storage_options=ceph_s3.storage_options())
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert (info["rows"], info["deleted_rows"]) == (4, 2), info


def _breaks(kind: str):
    """A read of the Delta log as it can fail under ``deleted_row_counts``: the store's error, a commit removed by
    log cleanup between listing and reading, a commit or checkpoint half written (bad JSON, a truncated Parquet)."""
    import io

    import pyarrow as pa

    def data_file(self, name, path):
        if not path.startswith("_delta_log/"):
            return real(self, name, path)
        if kind == "store":
            raise OSError("When reading information for key '_delta_log/...': AWS Error NETWORK_CONNECTION")
        if kind == "cleaned":
            raise FileNotFoundError(path)
        with real(self, name, path) as handle:
            data = handle.read()
        return pa.PythonFile(io.BytesIO(data[: len(data) // 2] if kind == "half" else b'{"add": {"pa\xff'), mode="r")

    real = Lake.data_file
    return data_file


def test_a_delta_log_that_cannot_be_read_falls_back_to_the_vectors_or_rows_unknown(tmp_path, monkeypatch):
    """Any failure to read or parse the log (not only a LakeError) falls back to decoding the vectors, and where that
    fails too, rows are unknown with the reason: `datahub inspect` ended in a traceback (an OSError from S3, a
    commit removed mid-read, a half-written checkpoint, bad JSON)."""
    from tests.lake.deletion_vectors import delete_rows

    inline = Lake(tmp_path / "inline")
    inline.commit("samples", sample_rows([f"document {i}" for i in range(6)], "a.jsonl"), txn="job-aaaaaaaaaaaa")
    delete_rows(inline, "samples", [1, 4])
    lost = Lake(tmp_path / "lost")  # the vector in a file that does not exist: no fallback either
    lost.commit("samples", sample_rows([f"document {i}" for i in range(6)], "a.jsonl"), txn="job-aaaaaaaaaaaa")
    delete_rows(lost, "samples", [1, 4], inline=False)
    checkpointed = Lake(tmp_path / "checkpointed")
    checkpointed.commit("samples", sample_rows([f"document {i}" for i in range(6)], "a.jsonl"),
                        txn="job-aaaaaaaaaaaa")
    delete_rows(checkpointed, "samples", [0, 2, 5])
    checkpointed.table("samples").create_checkpoint()
    for kind in ("store", "cleaned", "half", "bad json"):
        with monkeypatch.context() as patch:
            patch.setattr(Lake, "data_file", _breaks(kind))
            info = describe_lake(inline)["tables"]["samples"]
            assert (info["rows"], info["deleted_rows"]) == (4, 2), (kind, info)
            info = describe_lake(checkpointed)["tables"]["samples"]
            assert (info["rows"], info["deleted_rows"]) == (3, 3), (kind, info)
            info = describe_lake(lost, "samples")["tables"]["samples"]
            assert info["rows"] is None and "could not be read" in info["rows_unknown"], (kind, info)


def test_a_checkpoints_add_fields_are_taken_by_name_and_only_live_files_are_kept(tmp_path):
    """The checkpoint's ``add.path`` and ``add.deletionVector.cardinality`` are found by name, not by position (a
    writer may order the struct's fields otherwise), and a file added then removed is not kept."""
    import pyarrow.parquet as pq

    from datahub.lake.delta_log import deleted_row_counts

    log = tmp_path / "lake" / "t" / "_delta_log"
    log.mkdir(parents=True)
    vector = pa.struct([("storageType", pa.string()), ("cardinality", pa.int64())])
    add = pa.struct([("deletionVector", vector), ("size", pa.int64()), ("path", pa.string())])
    remove = pa.struct([("path", pa.string())])
    actions = pa.table({
        "remove": pa.array([None, None, {"path": "gone.parquet"}], remove),
        "add": pa.array([{"deletionVector": {"storageType": "i", "cardinality": 2}, "size": 1, "path": "a%20b.parquet"},
                         {"deletionVector": None, "size": 1, "path": "c.parquet"}, None], add),
    })
    pq.write_table(actions, log / "00000000000000000003.checkpoint.parquet")
    (log / "00000000000000000004.json").write_text(json.dumps({"add": {"path": "d.parquet", "deletionVector": {
        "storageType": "i", "cardinality": 1}}}) + "\n" + json.dumps({"commitInfo": {"operation": "DELETE"}}) + "\n")
    lake = Lake(tmp_path / "lake")
    assert deleted_row_counts(lake, "t", 4, ["a%20b.parquet", "c.parquet", "d.parquet"]) == {"a%20b.parquet": 2,
                                                                                             "d.parquet": 1}
