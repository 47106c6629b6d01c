"""datahub.export.exported_lineage: the one writer of ``exported`` lineage events (export, token export, tier copy)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa

from datahub.export.exported_lineage import commit_exported, commit_shard_index
from tests.export.helpers import cfs_storage, make_lake


def test_shard_index_is_one_idempotent_commit_streamed_per_shard(tmp_path) -> None:
    lake, _ = make_lake(tmp_path / "lake", 10)
    tier = cfs_storage(("cfs", tmp_path / "cfs")).tier("cfs")
    shards = [("r-000000.tar", pa.array(["b", "a"])), ("r-000001.tar", pa.array(["c"]))]
    pulled: list[str] = []

    def streamed() -> Iterator[tuple[str, pa.Array]]:
        for name, keys in shards:
            pulled.append(name)
            yield name, keys

    version = commit_shard_index(lake, "r", tier, streamed(), op="export@1", params_hash="k1")
    assert version is not None and pulled == ["r-000000.tar", "r-000001.tar"]
    rows = [r for r in lake.read("lineage").to_pylist() if r["run_id"] == "export/r/cfs"]
    assert sorted((r["sample_id"], r["op"], r["action"], r["params_hash"], json.loads(r["ref"])) for r in rows) == [
        ("a", "export@1", "exported", "k1", {"shard": tier.uri("r", "r-000000.tar"), "tier": "cfs", "member": "a.txt"}),
        ("b", "export@1", "exported", "k1", {"shard": tier.uri("r", "r-000000.tar"), "tier": "cfs", "member": "b.txt"}),
        ("c", "export@1", "exported", "k1", {"shard": tier.uri("r", "r-000001.tar"), "tier": "cfs", "member": "c.txt"}),
    ]
    assert len({r["ts"] for r in rows}) == 1

    pulled.clear()
    assert commit_shard_index(lake, "r", tier, streamed(), op="export@1", params_hash="k1") is None
    assert pulled == []  # committed before: nothing read
    commit = next(h for h in lake.table("lineage").history() if h.get("datahub.txn") == "export/r/cfs")
    assert (commit["datahub.export"], commit["datahub.tier"]) == ("r", "cfs")


def test_commit_exported_writes_the_refs_given_and_commits_an_empty_stream(tmp_path) -> None:
    lake, _ = make_lake(tmp_path / "lake", 10)
    refs = [(pa.array(["x", "y"]), pa.array(['{"document": 0}', '{"document": 1}']))]
    assert commit_exported(lake, iter(refs), txn="export-tokens/r/cfs/t1", op="export-tokens@1", params_hash="k",
                           metadata={"datahub.tokenizer": "t1"}) is not None
    rows = sorted((r["sample_id"], r["run_id"], r["ref"]) for r in lake.read("lineage").to_pylist()
                  if r["action"] == "exported")
    assert rows == [("x", "export-tokens/r/cfs/t1", '{"document": 0}'), ("y", "export-tokens/r/cfs/t1", '{"document": 1}')]
    before = lake.table("lineage").version()
    assert commit_exported(lake, iter([]), txn="export/empty/cfs", op="export@1", params_hash="k", metadata={}) \
        == before + 1  # an export of nothing is still recorded as done
    assert lake.applied("lineage", "export/empty/cfs")
