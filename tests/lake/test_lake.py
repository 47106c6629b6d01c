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
