"""Export planned on the driver and written by engine tasks: the same bytes as one process, any worker count."""

from __future__ import annotations

import hashlib
import logging
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datahub.export import export_table_version, read_lake_manifest
from datahub.export.plan import SummaryPlan, cut_shards, order_hash
from datahub.export.tiering import apply_tiers, plan_tiers
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)
from datahub.lake import Lake
from datahub.settings import KILL_AT_ENV
from tests.export.helpers import cfs_storage, make_lake, samples_table
from tests.pipeline.corpus import run_cli


def _reference_hash(key: str, seed: int) -> int:
    """keyed-fnv1a64-v1, one byte at a time in plain Python (the documented definition)."""
    mask = 2**64 - 1

    def fmix(value: int) -> int:
        value ^= value >> 33
        value = (value * 0xFF51AFD7ED558CCD) & mask
        value ^= value >> 33
        value = (value * 0xC4CEB9FE1A85EC53) & mask
        return value ^ (value >> 33)

    value = 0xCBF29CE484222325 ^ fmix(seed & mask)
    for byte in key.encode():
        value = ((value ^ byte) * 0x100000001B3) & mask
    return fmix(value)


def test_order_hash_matches_its_definition_for_equal_and_ragged_ids() -> None:
    for ids in (["a" * 32, "b" * 32, "0123456789abcdef" * 2], ["a", "bb", "ccc-_", "Z" * 90, "q"]):
        for seed in (0, 7, -1, 2**63 + 5):
            got = order_hash(pa.array(ids), seed).tolist()
            assert got == [_reference_hash(i, seed) for i in ids]
    assert order_hash(pa.array(["x"]), 1)[0] != order_hash(pa.array(["x"]), 2)[0]


def test_cut_shards_bounds_samples_and_keeps_a_big_sample_alone() -> None:
    spans = cut_shards(np.array([2048] * 10 + [10**6] + [2048] * 3), shard_size=20480, shard_samples=None)
    assert sum(s.samples for s in spans) == 14 and [s.start for s in spans][0] == 0
    assert any(s.samples == 1 and s.start == 10 for s in spans)
    assert [s.samples for s in cut_shards(np.full(10, 1024), shard_size=None, shard_samples=4)] == [4, 4, 2]


def _shards(manifest, tier: str) -> list[bytes]:
    return [Path(s.replicas[tier]).read_bytes() for s in manifest.shards]


@pytest.mark.parametrize("settings", [{"shard_samples": 13}, {"shard_size": 20000, "shuffle_seed": 11}])
def test_ray_export_writes_the_bytes_of_a_local_export_with_one_or_two_workers(tmp_path, ray_engine, settings) -> None:
    lake, version = make_lake(tmp_path / "lake", 150, with_binary=True)
    storage = cfs_storage(("local", tmp_path / "local"), ("ray1", tmp_path / "ray1"), ("ray2", tmp_path / "ray2"))

    def run(release: str, tier: str, **kw):
        return export_table_version(lake, table="samples", version=version, release_name=release, tier=tier,
                                    storage=storage, **settings, **kw)

    local = run("rel-local", "local")
    one = run("rel-ray1", "ray1", engine=ray_engine, workers=1)
    two = run("rel-ray2", "ray2", engine=ray_engine, workers=2)
    assert len(local.shards) > 3
    # shard names carry the release name (inside the tar only the members, so the bytes compare directly)
    assert _shards(local, "local") == _shards(one, "ray1") == _shards(two, "ray2")
    assert [s.sha256 for s in local.shards] == [s.sha256 for s in two.shards]
    assert local.num_samples == two.num_samples == 150
    rows = [r for r in lake.read("lineage").to_pylist() if r["run_id"] == "export/rel-ray2/ray2"]
    assert len(rows) == 150 and len({r["sample_id"] for r in rows}) == 150
    assert read_lake_manifest(lake, "rel-ray2") == two
    assert not (tmp_path / "ray2/rel-ray2/_partial").exists()


def test_ray_export_of_many_data_files_matches_a_local_export_and_removes_its_runs(tmp_path, ray_engine) -> None:
    """Each read task sorts its file's rows into a run on local disk; every shard takes a slice of each run."""
    lake = Lake(tmp_path / "lake")
    for part in range(4):
        version = lake.commit("samples", samples_table(40, start=40 * part, with_binary=True), txn=f"seed/{part}")
    assert len(lake.dataset("samples", version).files) >= 4
    storage = cfs_storage(("local", tmp_path / "local"), ("ray", tmp_path / "ray"))
    spill = tmp_path / "spill"
    spill.mkdir()

    def run(release: str, tier: str, **kw):
        return export_table_version(lake, table="samples", version=version, release_name=release, tier=tier,
                                    storage=storage, shard_size=30000, shuffle_seed=3, **kw)

    local = run("rel-local", "local")
    ray = run("rel-ray", "ray", engine=ray_engine, workers=2, spill_dir=str(spill))
    assert len(local.shards) > 4 and local.num_samples == ray.num_samples == 160
    assert _shards(local, "local") == _shards(ray, "ray")
    assert list(spill.iterdir()) == []


@pytest.mark.parametrize("settings", [{"shard_size": 30000, "shuffle_seed": 3}, {"shard_samples": 11}])
def test_ray_export_planned_in_many_buckets_writes_the_bytes_of_one_bucket(tmp_path, ray_engine, settings,
                                                                          monkeypatch) -> None:
    """The driver plans from the runs' summaries on local disk, key bucket by key bucket (``bucket_rows``): with a
    bucket of 5 rows (shards span buckets, a bucket's rows come from every run) the shards, lineage and digest are
    those of a one-bucket plan and of an export in one process."""
    lake = Lake(tmp_path / "lake")
    for part in range(4):
        version = lake.commit("samples", samples_table(40, start=40 * part, with_binary=True), txn=f"seed/{part}")
    tiers = ("local", "one", "many")
    storage = cfs_storage(*((name, tmp_path / name) for name in tiers))
    spill = tmp_path / "spill"
    spill.mkdir()

    def run(tier: str, **kw):
        return export_table_version(lake, table="samples", version=version, release_name=f"rel-{tier}", tier=tier,
                                    storage=storage, **settings, **kw)

    local = run("local")
    plans = []
    planned = SummaryPlan.plan
    monkeypatch.setattr(SummaryPlan, "plan", lambda self, **kw: plans.append(planned(self, **kw)) or plans[-1])
    one = run("one", engine=ray_engine, workers=2)
    many = run("many", engine=ray_engine, workers=2, bucket_rows=5, spill_dir=str(spill))
    assert [p.buckets for p in plans[:1]] == [1] and plans[1].buckets >= 20
    starts = set(plans[1].bucket_starts.tolist())
    assert any(starts & set(range(s.start + 1, s.start + s.samples)) for s in plans[1].spans)  # shards span buckets
    assert len(local.shards) > 4 and local.num_samples == many.num_samples == 160
    assert _shards(local, "local") == _shards(one, "one") == _shards(many, "many")
    assert local.release_digest == one.release_digest == many.release_digest
    lineage = {tier: sorted((r["sample_id"], r["ref"].split('"member": ')[1]) for r in lake.read("lineage").to_pylist()
                            if r["run_id"] == f"export/rel-{tier}/{tier}") for tier in tiers}
    assert lineage["local"] == lineage["one"] == lineage["many"] and len(lineage["many"]) == 160
    assert list(spill.iterdir()) == []


def test_ray_export_killed_after_a_shard_resumes_to_the_bytes_of_a_local_export(tmp_path) -> None:
    """kill -9 of the driver mid-write (its Ray goes with it): the re-run keeps the journalled shards and writes the
    rest from a fresh read into runs; shards, manifest and exported lineage are those of a clean export."""
    make_lake(tmp_path / "lake", 120)
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n"
                       f"  local:\n    kind: cfs\n    path: {tmp_path / 'local'}\n")

    scratch = Path(tempfile.mkdtemp(prefix="dh-", dir="/tmp"))  # TMPDIR; short: Ray's socket paths live under it

    def export(release: str, tier: str, *extra: str, kill_at: str | None = None):
        env = {"RAY_AUTH_MODE": "disabled", "TMPDIR": str(scratch), **({KILL_AT_ENV: kill_at} if kill_at else {})}
        return run_cli(["export", release, "--lake", str(tmp_path / "lake"), "--tier", tier, "--storage", str(storage),
                        "--table", "samples", "--shard-samples", "25", "--shuffle-seed", "4", "--json", *extra],
                       env=env, timeout=300)

    def runs_left() -> list[str]:
        return sorted(p.name for p in scratch.glob("datahub-export-*/*.arrow"))

    ray = ("--engine", "ray", "--workers", "2")
    try:
        killed = export("r1", "cfs", *ray, kill_at="export:after_shard:1")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        journal = list((tmp_path / "cfs" / "r1" / "_partial").rglob("*.json"))
        assert journal and not list((tmp_path / "lake").rglob("manifest.json"))
        assert runs_left()  # kill -9: no cleanup ran
        assert export("r1", "cfs", *ray).returncode == 0
        assert runs_left() == [] and not list(scratch.glob("datahub-export-*"))  # the re-run swept the killed one's
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert export("r1-local", "local").returncode == 0
    lake = Lake(tmp_path / "lake")
    resumed, local = read_lake_manifest(lake, "r1"), read_lake_manifest(lake, "r1-local")
    assert resumed is not None and local is not None and len(resumed.shards) == 5
    assert [(s.sha256, s.samples) for s in resumed.shards] == [(s.sha256, s.samples) for s in local.shards]
    # no journal, temp file or stray shard left
    assert sorted(p.name for p in (tmp_path / "cfs" / "r1").iterdir()) == sorted([*(s.name for s in resumed.shards),
                                                                                  "manifest.json"])
    exported = [r for r in lake.read("lineage").to_pylist() if r["run_id"] == "export/r1/cfs"]
    assert len(exported) == 120 and len({r["sample_id"] for r in exported}) == 120


def test_export_again_rewrites_damaged_shards_and_says_so(tmp_path, caplog) -> None:
    lake, version = make_lake(tmp_path / "lake", 60)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))

    def run(**kw):
        return export_table_version(lake, table="samples", version=version, release_name="r", tier="cfs",
                                    storage=storage, shard_samples=10, **kw)

    manifest = run()
    truncated, flipped = (Path(manifest.shards[i].replicas["cfs"]) for i in (1, 4))
    truncated.write_bytes(truncated.read_bytes()[:-512])
    data = bytearray(flipped.read_bytes())
    data[700] ^= 0xFF
    flipped.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert run() == manifest  # size check: the truncated shard is rewritten, the flipped one not seen
    assert "r-000001.tar" in caplog.text and "r-000004.tar" not in caplog.text
    assert hashlib.sha256(truncated.read_bytes()).hexdigest() == manifest.shards[1].sha256
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert run(verify=True) == manifest  # sha256: the flipped shard too
    assert "r-000004.tar" in caplog.text
    for shard in manifest.shards:
        assert hashlib.sha256(Path(shard.replicas["cfs"]).read_bytes()).hexdigest() == shard.sha256


def test_tier_apply_copies_damaged_replicas_again_from_an_intact_tier(tmp_path, caplog) -> None:
    lake, version = make_lake(tmp_path / "lake", 40)
    storage = cfs_storage(("a", tmp_path / "a"), ("b", tmp_path / "b"))
    export_table_version(lake, table="samples", version=version, release_name="r", tier="a", storage=storage,
                         shard_samples=10)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage)
    manifest = read_lake_manifest(lake, "r")
    assert plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}).moves == ()
    missing = Path(manifest.shards[0].replicas["b"])
    missing.unlink()
    flipped = Path(manifest.shards[2].replicas["b"])
    data = bytearray(flipped.read_bytes())
    data[600] ^= 1
    flipped.write_bytes(bytes(data))
    plan = plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]})
    assert [(m.action, m.tier, m.source, m.shards) for m in plan.moves] == [("repair", "b", "a", 1)]
    verified = plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}, verify=True)
    assert [(m.action, m.shards, m.verify) for m in verified.moves] == [("repair", 2, True)]
    with caplog.at_level(logging.WARNING):
        apply_tiers(lake, verified, storage=storage)
    assert "r-000000.tar" in caplog.text and "r-000002.tar" in caplog.text
    for shard in manifest.shards:
        assert hashlib.sha256(Path(shard.replicas["b"]).read_bytes()).hexdigest() == shard.sha256
    assert plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}, verify=True).moves == ()


def test_spark_export_writes_the_bytes_of_a_local_export(tmp_path, spark_engine) -> None:
    """Spark plans through its own read tasks (ids, order hashes and sizes only; on the driver's disk, in one key
    bucket or several) and writes the same shards as one process."""
    lake, version = make_lake(tmp_path / "lake", 120, with_binary=True)
    storage = cfs_storage(("local", tmp_path / "local"), ("spark", tmp_path / "spark"), ("many", tmp_path / "many"))
    settings = {"shard_size": 20000, "shuffle_seed": 5}
    local = export_table_version(lake, table="samples", version=version, release_name="rel", tier="local",
                                 storage=storage, **settings)
    spark = export_table_version(lake, table="samples", version=version, release_name="rel-spark", tier="spark",
                                 storage=storage, engine=spark_engine, workers=2, **settings)
    many = export_table_version(lake, table="samples", version=version, release_name="rel-many", tier="many",
                                storage=storage, engine=spark_engine, workers=2, bucket_rows=7, **settings)
    assert len(local.shards) > 3 and local.num_samples == spark.num_samples == many.num_samples == 120
    assert _shards(local, "local") == _shards(spark, "spark") == _shards(many, "many")
    assert local.release_digest == spark.release_digest == many.release_digest


def test_ray_export_again_rewrites_only_missing_shards_with_the_same_bytes(tmp_path, ray_engine) -> None:
    """The engine's shuffle with some shards only (``only``): rows of intact shards are not written again."""
    lake, version = make_lake(tmp_path / "lake", 90, with_binary=True)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))

    def run():
        return export_table_version(lake, table="samples", version=version, release_name="r", tier="cfs",
                                    storage=storage, shard_samples=10, shuffle_seed=2, engine=ray_engine, workers=2)

    manifest = run()
    missing = [Path(manifest.shards[i].replicas["cfs"]) for i in (0, 5, 8)]
    intact = Path(manifest.shards[3].replicas["cfs"])
    before = intact.stat().st_mtime_ns
    for path in missing:
        path.unlink()
    assert run() == manifest
    for path, shard in zip(missing, [manifest.shards[i] for i in (0, 5, 8)]):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shard.sha256
    assert intact.stat().st_mtime_ns == before
