"""Lake commits: one commit per transaction id, and the same id twice changes nothing."""

from __future__ import annotations

import multiprocessing

import pyarrow as pa
import pytest

from datahub.errors import LakeError
from datahub.lake import Lake
from datahub.lake.tables import SCHEMA_VERSION


def test_commit_same_txn_twice_is_a_no_op(tmp_path):
    lake = Lake(tmp_path)
    data = pa.table({"sample_id": ["a", "b"], "n": [1, 2]})
    first = lake.commit("samples", data, txn="run-1", metadata={"datahub.run_id": "run-1", "counts": {"n": 2}})
    assert first is not None
    version = lake.version("samples")
    assert lake.commit("samples", data, txn="run-1") is None
    assert lake.version("samples") == version and lake.read("samples").num_rows == 2
    assert lake.commit("samples", data, txn="run-2") == version + 1
    assert lake.read("samples").num_rows == 4
    history = lake.history("samples")
    assert history[0]["datahub.txn"] == "run-2"
    assert any(h.get("counts") == '{"n": 2}' for h in history)  # structured metadata stored as JSON


def test_schema_version_and_time_travel(tmp_path):
    lake = Lake(tmp_path)
    lake.commit("t", pa.table({"x": [1]}), txn="a")
    v = lake.version("t")
    lake.commit("t", pa.table({"x": [2, 3]}), txn="b")
    assert lake.schema_version("t") == SCHEMA_VERSION
    assert lake.read("t", version=v).column("x").to_pylist() == [1]
    assert sorted(lake.read("t").column("x").to_pylist()) == [1, 2, 3]
    assert lake.tables() == ["t"]


def test_streamed_batches_are_one_commit(tmp_path):
    lake = Lake(tmp_path)
    batches = (pa.table({"i": list(range(k * 10, k * 10 + 10))}) for k in range(5))
    lake.commit("t", batches, txn="stream")
    assert lake.read("t").num_rows == 50
    history = lake.history("t")
    writes = [h for h in history if h["operation"] == "WRITE"]
    assert len(writes) == 1 and writes[0]["operationMetrics"]["num_added_rows"] == 50  # one commit, not one per batch


def test_missing_table_error_names_it(tmp_path):
    with pytest.raises(LakeError, match="no Delta table 'samples'"):
        Lake(tmp_path).table("samples")
    assert Lake(tmp_path).read("samples").num_rows == 0


def test_a_version_the_table_does_not_have_is_an_error_naming_the_latest(tmp_path):
    lake = Lake(tmp_path)
    lake.commit("t", pa.table({"x": [1]}), txn="a")
    latest = lake.version("t")
    with pytest.raises(LakeError, match=f"no version {latest + 5} of table 't'; its latest is {latest}"):
        lake.table("t", latest + 5)
    with pytest.raises(LakeError, match="no version -1 of table 't'; versions count from 0"):
        lake.read("t", version=-1)
    assert lake.read("t", version=latest).num_rows == 1


def _append(root: str, txn: str, n: int) -> None:
    Lake(root).commit("shared", pa.table({"txn": [txn] * n}), txn=txn)


def test_concurrent_writers_lose_nothing(tmp_path):
    Lake(tmp_path).commit("shared", pa.table({"txn": ["seed"]}), txn="seed")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append, args=(str(tmp_path), f"w{i}", 100)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    counts = Lake(tmp_path).read("shared").group_by("txn").aggregate([("txn", "count")]).to_pylist()
    assert {c["txn"]: c["txn_count"] for c in counts} == {"seed": 1, "w0": 100, "w1": 100, "w2": 100, "w3": 100}


# A checkpoint every 2 commits and a zero log retention make deltalake's post-commit cleanup
# eligible at once (the defaults, 100 commits and 30 days, only delay the same loss).
TINY_RETENTION = {"delta.checkpointInterval": "2", "delta.logRetentionDuration": "interval 0 seconds"}


def _log_files(path) -> list[str]:
    return sorted(p.name for p in (path / "_delta_log").iterdir())


def test_installed_deltalake_drops_old_versions_without_keep_log(tmp_path):
    """The hazard Lake.keep_log guards against, shown on a table that datahub did not create."""
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(str(tmp_path / "raw"), pa.table({"x": [0]}), configuration=TINY_RETENTION)
    for i in range(1, 6):
        write_deltalake(str(tmp_path / "raw"), pa.table({"x": [i]}), mode="append")
    assert "00000000000000000000.json" not in _log_files(tmp_path / "raw")
    with pytest.raises(Exception, match="log segment"):
        DeltaTable(str(tmp_path / "raw"), version=0)


def test_lake_tables_keep_their_log_through_checkpoints(tmp_path):
    from deltalake import write_deltalake

    lake = Lake(tmp_path)
    first = lake.commit("t", pa.table({"x": [0]}), txn="c0")
    assert lake.table("t").metadata().configuration["delta.enableExpiredLogCleanup"] == "false"
    lake.table("t").alter.set_table_properties(TINY_RETENTION)
    for i in range(1, 6):
        lake.commit("t", pa.table({"x": [i]}), txn=f"c{i}")
    # another writer with deltalake's default post-commit hook honours the table property too
    for i in range(6, 9):
        write_deltalake(lake.table_uri("t"), pa.table({"x": [i]}), mode="append")
    lake.table("t").optimize.compact()
    files = _log_files(tmp_path / "t")
    assert any(name.endswith(".checkpoint.parquet") for name in files)  # cleanup had its chances
    assert "00000000000000000000.json" in files
    assert lake.read("t", version=first).column("x").to_pylist() == [0]
    assert sorted(lake.read("t").column("x").to_pylist()) == list(range(9))


def test_tables_created_by_other_writers_are_protected_on_next_commit(tmp_path):
    from deltalake import write_deltalake

    lake = Lake(tmp_path)
    write_deltalake(lake.table_uri("old"), pa.table({"x": [0]}), configuration=TINY_RETENTION)
    assert "delta.enableExpiredLogCleanup" not in lake.table("old").metadata().configuration
    lake.commit("old", pa.table({"x": [1]}), txn="first-datahub-commit")
    configuration = lake.table("old").metadata().configuration
    assert configuration["delta.enableExpiredLogCleanup"] == "false"
    assert configuration["datahub.schemaVersion"] == SCHEMA_VERSION
    for i in range(2, 7):
        write_deltalake(lake.table_uri("old"), pa.table({"x": [i]}), mode="append")
    assert lake.read("old", version=0).column("x").to_pylist() == [0]
    assert lake.keep_log("old").version() == lake.version("old")  # already protected: no further commit


def _append_together(root: str, txn: str, n: int, barrier) -> None:
    lake = Lake(root)
    barrier.wait(60)  # everyone imported and ready: commit at the same moment
    lake.commit("shared", pa.table({"txn": [txn] * n}), txn=txn)


def test_concurrent_writers_creating_a_new_table_lose_nothing(tmp_path):
    """Racing creators: one creates the table, the others append; the properties commit races too."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_append_together, args=(str(tmp_path), f"w{i}", 10, barrier)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lake = Lake(tmp_path)
    counts = lake.read("shared").group_by("txn").aggregate([("txn", "count")]).to_pylist()
    assert {c["txn"]: c["txn_count"] for c in counts} == {f"w{i}": 10 for i in range(4)}
    assert lake.schema_version("shared") == SCHEMA_VERSION


def test_processes_that_read_a_table_exit_cleanly(tmp_path):
    """Reading through delta-rs's filesystem handler aborted ~1 in 3 short processes at exit
    ("terminate called without an active exception"); Lake reads through pyarrow's own."""
    import subprocess
    import sys

    Lake(tmp_path).commit("t", pa.table({"a": list(range(1000)), "b": ["x"] * 1000}), txn="t1")
    script = f"from datahub.lake import Lake\nassert Lake({str(tmp_path)!r}).read('t').num_rows == 1000\n"
    statuses = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
                for _ in range(10)]
    assert [s.returncode for s in statuses] == [0] * 10, [s.stderr[-300:] for s in statuses if s.returncode]
