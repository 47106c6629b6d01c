"""tier plan/apply across cfs and hdfs (the WebHDFS-protocol server on loopback): copy, verify, switch, delete."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from pathlib import Path

import fsspec
import pytest

from datahub.export import export_table_version, read_lake_manifest
from datahub.export.tiering import apply_tiers, plan_tiers
from datahub.storage import ReleaseState, Tier, validate_storage_config
from datahub.storage.tier import STALE_PARTIAL_S
from tests.export.helpers import make_lake, publish_held_halfway
from tests.servers.webhdfs import WebHdfsServer


@pytest.fixture
def webhdfs(tmp_path):
    with WebHdfsServer(tmp_path / "hdfs-data") as server:
        yield server


def _storage(tmp_path, server):
    return validate_storage_config({
        "tiers": {"cfs": {"kind": "cfs", "path": str(tmp_path / "cfs")},
                  "hdfs": {"kind": "hdfs", "url": server.url("/datahub/releases"), "user": "datahub"}},
        "policy": {"classes": {"hot": ["cfs", "hdfs"], "warm": ["hdfs"]}},
    }, source="storage.yaml")


def test_export_to_hdfs_uses_rename_and_loader_reads_it(tmp_path, webhdfs) -> None:
    from datahub.loader.manifest import load_manifest
    from datahub.loader.shard_source import ShardSource

    lake, version = make_lake(tmp_path / "lake", 60)
    storage = _storage(tmp_path, webhdfs)
    on_disk = webhdfs.root / "datahub/releases/r1"
    on_disk.mkdir(parents=True)
    (on_disk / ".r1-000001.tar.partial-abcdef012345").write_bytes(b"a killed upload's temp file")  # swept at the end
    _age(on_disk / ".r1-000001.tar.partial-abcdef012345", STALE_PARTIAL_S + 60)  # hdfs: by age (an hour unwritten)
    manifest = export_table_version(lake, table="samples", version=version, release_name="r1", tier="hdfs",
                                    storage=storage, shard_samples=25)
    assert webhdfs.ops["RENAME"] >= len(manifest.shards) + 1  # shards + manifest went through temp + rename
    assert manifest.shards[0].replicas["hdfs"] == webhdfs.url("/datahub/releases/r1/r1-000000.tar")
    assert sorted(p.name for p in on_disk.iterdir()) == ["manifest.json", "r1-000000.tar", "r1-000001.tar", "r1-000002.tar"]
    source = ShardSource(load_manifest("r1", lake=str(tmp_path / "lake")),
                         storage={"hdfs": storage.tier("hdfs").reader_options()})
    assert source.read(1) == (on_disk / "r1-000001.tar").read_bytes()


def test_plan_apply_moves_by_policy_resumes_and_is_idempotent(tmp_path, webhdfs, monkeypatch) -> None:
    lake, version = make_lake(tmp_path / "lake", 80)
    storage = _storage(tmp_path, webhdfs)
    manifest = export_table_version(lake, table="samples", version=version, release_name="r1", tier="cfs",
                                    storage=storage, shard_samples=20)
    total = sum(s.size for s in manifest.shards)

    hot = {"r1": ReleaseState("r1", channels=("stable",))}
    plan = plan_tiers(lake, storage=storage, states=hot)
    assert [(m.action, m.tier, m.source, m.bytes, m.storage_class) for m in plan.moves] == [
        ("copy", "hdfs", "cfs", total, "hot")]

    # interrupt the copy after two shards landed: no manifest mentions hdfs yet
    real = Tier.publish_stream
    calls = []

    def flaky(self, uri, chunks, *, size, sha256):
        calls.append(uri)
        if len(calls) == 3:
            raise ConnectionError("namenode went away")
        return real(self, uri, chunks, size=size, sha256=sha256)

    monkeypatch.setattr(Tier, "publish_stream", flaky)
    with pytest.raises(ConnectionError):
        apply_tiers(lake, plan, storage=storage, workers=1)  # one copy at a time: exactly two shards landed
    assert read_lake_manifest(lake, "r1").tiers == ["cfs"]
    monkeypatch.setattr(Tier, "publish_stream", real)
    creates_before = webhdfs.ops["CREATE"]
    apply_tiers(lake, plan_tiers(lake, storage=storage, states=hot), storage=storage)
    assert webhdfs.ops["CREATE"] - creates_before == (len(manifest.shards) - 2) + 1  # the 2 missing shards + manifest
    after_copy = read_lake_manifest(lake, "r1")
    assert after_copy.tiers == ["cfs", "hdfs"]
    assert json.loads((tmp_path / "cfs/r1/manifest.json").read_text()) == after_copy.to_dict()
    exported = [json.loads(r["ref"])["tier"] for r in lake.read("lineage").to_pylist()]
    assert sorted(set(exported)) == ["cfs", "hdfs"] and len(exported) == 160
    assert plan_tiers(lake, storage=storage, states=hot).moves == ()  # applying twice is a no-op

    # the release cools down to warm: hdfs only; cfs goes after the manifest stops naming it
    warm = {"r1": ReleaseState("r1")}
    plan = plan_tiers(lake, storage=storage, states=warm)
    assert [(m.action, m.tier) for m in plan.moves] == [("delete", "cfs")] and plan.bytes_to_delete == total
    apply_tiers(lake, plan, storage=storage)
    final = read_lake_manifest(lake, "r1")
    assert final.tiers == ["hdfs"] and not (tmp_path / "cfs/r1").exists()
    with fsspec.open(final.shards[3].replicas["hdfs"], "rb", **storage.tier("hdfs").reader_options()) as handle:
        import hashlib

        assert hashlib.sha256(handle.read()).hexdigest() == final.shards[3].sha256
    assert plan_tiers(lake, storage=storage, states=warm).moves == ()


def test_delete_interrupted_after_manifest_switch_is_finished_as_leftover(tmp_path, webhdfs, monkeypatch) -> None:
    lake, version = make_lake(tmp_path / "lake", 30)
    storage = _storage(tmp_path, webhdfs)
    export_table_version(lake, table="samples", version=version, release_name="r2", tier="cfs", storage=storage,
                         shard_samples=10)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r2": ["cfs", "hdfs"]}), storage=storage)
    monkeypatch.setattr(Tier, "delete", lambda self, uri, recursive=False: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):
        apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r2": ["hdfs"]}), storage=storage)
    monkeypatch.undo()
    assert read_lake_manifest(lake, "r2").tiers == ["hdfs"] and (tmp_path / "cfs/r2").exists()
    plan = plan_tiers(lake, storage=storage, targets={"r2": ["hdfs"]})
    assert [(m.action, m.tier, m.leftover) for m in plan.moves] == [("delete", "cfs", True)]
    apply_tiers(lake, plan, storage=storage)
    assert not Path(tmp_path / "cfs/r2").exists()
    assert plan_tiers(lake, storage=storage, targets={"r2": ["hdfs"]}).moves == ()


def test_cross_region_copy_uses_a_second_storage_config(tmp_path, webhdfs) -> None:
    lake, version = make_lake(tmp_path / "lake", 20)
    home = _storage(tmp_path, webhdfs)
    export_table_version(lake, table="samples", version=version, release_name="r3", tier="cfs", storage=home,
                         shard_samples=8)
    remote = validate_storage_config({"tiers": {"cfs-eu": {"kind": "cfs", "path": str(tmp_path / "eu")}}}, source="eu.yaml")
    both = home.merged(remote)
    apply_tiers(lake, plan_tiers(lake, storage=both, targets={"r3": ["cfs", "cfs-eu"]}), storage=both)
    manifest = read_lake_manifest(lake, "r3")
    assert manifest.tiers == ["cfs", "cfs-eu"]
    for shard in manifest.shards:
        assert Path(shard.replicas["cfs-eu"]).read_bytes() == Path(shard.replicas["cfs"]).read_bytes()


def test_copy_reads_each_source_shard_once_and_indexes_lineage_from_the_copies(tmp_path, webhdfs, monkeypatch) -> None:
    """copy = one read per shard at the source; the lineage index comes from the ``__index__`` member of each
    verified copy (ranged reads of its tail), so it needs no table version (gone here: vacuumed)."""
    from datahub.shards.index import index_tar

    lake, version = make_lake(tmp_path / "lake", 40)
    storage = validate_storage_config({"tiers": {
        "hdfs": {"kind": "hdfs", "url": webhdfs.url("/releases")},
        "cfs": {"kind": "cfs", "path": str(tmp_path / "cfs")}, "cfs2": {"kind": "cfs", "path": str(tmp_path / "cfs2")}}})
    manifest = export_table_version(lake, table="samples", version=version, release_name="r4", tier="hdfs",
                                    storage=storage, shard_samples=10, shuffle_seed=3)
    opens = webhdfs.ops["OPEN"]
    import datahub.export.tiering as tiering

    def whole_shard_index(*args, **kwargs):
        raise AssertionError("a shard was read whole for its keys: its __index__ member should do")

    monkeypatch.setattr(tiering, "index_tar", whole_shard_index)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r4": ["hdfs", "cfs"]}), storage=storage)
    assert webhdfs.ops["OPEN"] - opens == len(manifest.shards) == 4
    monkeypatch.undo()

    def index(tier: str) -> dict[str, str]:
        rows = [r for r in lake.read("lineage").to_pylist() if r["run_id"] == f"export/r4/{tier}"]
        return {r["sample_id"]: json.loads(r["ref"])["shard"] for r in rows}

    def truth(tier: str) -> dict[str, str]:
        return {key: shard.replicas[tier] for shard in read_lake_manifest(lake, "r4").shards
                for key in index_tar(Path(shard.replicas[tier]).read_bytes(), where=shard.name).keys}

    assert index("cfs") == truth("cfs") and len(index("cfs")) == 40
    # the copy's lineage rows read as the export's own (same op, params, ref fields), tier and shard aside
    rows = {tier: sorted((r["sample_id"], r["op"], r["action"], r["params_hash"], json.loads(r["ref"])["member"],
                          sorted(json.loads(r["ref"])))
                         for r in lake.read("lineage").to_pylist() if r["run_id"] == f"export/r4/{tier}")
            for tier in ("hdfs", "cfs")}
    assert rows["cfs"] == rows["hdfs"]

    for data in (tmp_path / "lake/samples").glob("*.parquet"):  # the frozen version's files are gone (vacuumed)
        data.unlink()
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r4": ["hdfs", "cfs", "cfs2"]}), storage=storage)
    assert index("cfs2") == truth("cfs2") and len(index("cfs2")) == 40


def test_loader_reads_from_a_hung_datanode_time_out(tmp_path, webhdfs) -> None:
    """fsspec's WebHDFS client has no timeout: the loader bounds it by its ReadPolicy, then reports the replica."""
    import time

    from datahub.errors import StorageError
    from datahub.loader.manifest import load_manifest
    from datahub.loader.read_policy import ReadPolicy
    from datahub.loader.shard_source import ShardSource

    lake, version = make_lake(tmp_path / "lake", 30)
    storage = _storage(tmp_path, webhdfs)
    export_table_version(lake, table="samples", version=version, release_name="r1", tier="hdfs", storage=storage,
                         shard_samples=15)
    policy = ReadPolicy(connect_timeout_s=1.0, read_timeout_s=0.5, attempts=1, backoff_s=0)
    source = ShardSource(load_manifest("r1", lake=str(tmp_path / "lake")), read_policy=policy,
                         storage={"hdfs": storage.tier("hdfs").reader_options()})
    webhdfs.stall_ops["datanode:OPEN"] = 5.0  # accepts the read, never answers in time
    started = time.monotonic()
    with pytest.raises(StorageError, match="r1-000000"):
        source.read(0)
    assert time.monotonic() - started < 4.0
    webhdfs.stall_ops.clear()
    assert source.read(0) == (webhdfs.root / "datahub/releases/r1/r1-000000.tar").read_bytes()


def test_copy_streams_from_the_next_replica_when_one_is_damaged_or_missing_under_one_cap(tmp_path, monkeypatch) -> None:
    """A replica whose bytes do not match the manifest (same size, one bit flipped) or that is gone is skipped
    as the copy streams: nothing of it is published, the next replica is copied; every byte read from a source
    passes the one bandwidth cap of the apply."""
    import hashlib

    from datahub.storage.bandwidth import BandwidthCap
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 40)
    storage = cfs_storage(("a", tmp_path / "a"), ("b", tmp_path / "b"), ("c", tmp_path / "c"))
    export_table_version(lake, table="samples", version=version, release_name="r", tier="a", storage=storage,
                         shard_samples=10)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage)
    manifest = read_lake_manifest(lake, "r")
    flipped = Path(manifest.shards[1].replicas["a"])
    data = bytearray(flipped.read_bytes())
    data[700] ^= 1
    flipped.write_bytes(bytes(data))
    Path(manifest.shards[3].replicas["a"]).unlink()

    taken: list[int] = []
    real_take = BandwidthCap.take
    monkeypatch.setattr(BandwidthCap, "take", lambda self, size: (taken.append(size), real_take(self, size))[1])
    index_reads = _count_range_reads(monkeypatch)
    plan = plan_tiers(lake, storage=storage, targets={"r": ["a", "b", "c"]})
    assert [(m.action, m.tier, m.shards) for m in plan.moves] == [("repair", "a", 1), ("copy", "c", 4)]
    apply_tiers(lake, plan, storage=storage, max_bytes_per_s=1e12)
    for shard in read_lake_manifest(lake, "r").shards:
        assert hashlib.sha256(Path(shard.replicas["c"]).read_bytes()).hexdigest() == shard.sha256
    assert Path(manifest.shards[3].replicas["a"]).read_bytes() == Path(manifest.shards[3].replicas["b"]).read_bytes()
    assert not list((tmp_path / "c" / "r").glob(".*partial*"))
    sizes = [s.size for s in manifest.shards]
    # sources: the repair of a (shard 3, from b); the copy to c: four shards, and the damaged replica of shard 1
    # read once; then each copy read back at its destination (shard 3 on a, four shards on c), and c's __index__
    # tails for the lineage
    assert sum(taken) == (sum(sizes) + sizes[1] + sizes[3]) + (sizes[3] + sum(sizes)) + sum(index_reads)


def _count_range_reads(monkeypatch) -> list[int]:
    """Sizes of every Tier.read_range answer from now on (the lineage index reads a shard's tail)."""
    reads: list[int] = []
    real = Tier.read_range

    def counted(self, uri: str, start: int, end: int) -> bytes:
        data = real(self, uri, start, end)
        reads.append(len(data))
        return data

    monkeypatch.setattr(Tier, "read_range", counted)
    return reads


def test_bandwidth_cap_covers_the_verify_reads_at_the_destination(tmp_path, monkeypatch) -> None:
    """--max-mb-s caps every byte tier apply reads: the source, the read-back of each copy, the sha256 check of a
    replica already on the destination (resume) and of kept replicas with --verify, the index tails."""
    from datahub.storage.bandwidth import BandwidthCap
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 40)
    storage = cfs_storage(("a", tmp_path / "a"), ("b", tmp_path / "b"))
    manifest = export_table_version(lake, table="samples", version=version, release_name="r", tier="a",
                                    storage=storage, shard_samples=10)
    sizes = [s.size for s in manifest.shards]
    (tmp_path / "b" / "r").mkdir(parents=True)  # a killed apply had copied shard 0 already
    (tmp_path / "b" / "r" / manifest.shards[0].name).write_bytes(Path(manifest.shards[0].replicas["a"]).read_bytes())

    taken: list[int] = []
    real_take = BandwidthCap.take
    monkeypatch.setattr(BandwidthCap, "take", lambda self, size: (taken.append(size), real_take(self, size))[1])
    index_reads = _count_range_reads(monkeypatch)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage,
                max_bytes_per_s=1e12)
    assert read_lake_manifest(lake, "r").tiers == ["a", "b"]
    # shard 0: its sha256 checked on b (kept, not copied); shards 1-3: read at a, written, read back on b
    assert sum(taken) == sizes[0] + 2 * sum(sizes[1:]) + sum(index_reads)

    taken.clear()
    plan = plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}, verify=True, max_bytes_per_s=1e12)
    assert plan.moves == ()
    assert sum(taken) == 2 * sum(sizes)  # --verify: every kept replica on a and on b hashed under the cap


def test_copy_and_repair_remove_what_a_killed_apply_left(tmp_path) -> None:
    """A copy killed mid-shard leaves a temp file (cfs, hdfs) or an incomplete multipart upload (ceph, tested in
    tests/storage/test_sweep_partials_ceph.py); the apply that finishes the copy or the repair sweeps it."""
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 20)
    storage = cfs_storage(("a", tmp_path / "a"), ("b", tmp_path / "b"))
    manifest = export_table_version(lake, table="samples", version=version, release_name="r", tier="a",
                                    storage=storage, shard_samples=10)
    (tmp_path / "b" / "r").mkdir(parents=True)
    killed = tmp_path / "b" / "r" / f".{manifest.shards[0].name}.partial-abcdef012345"
    killed.write_bytes(b"half a shard")
    _age(killed, STALE_PARTIAL_S + 60)  # killed over an hour ago (a fresher one may be a live writer's)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage)
    assert not killed.exists()
    assert sorted(p.name for p in (tmp_path / "b" / "r").iterdir()) == sorted(
        [s.name for s in manifest.shards] + ["manifest.json"])

    Path(read_lake_manifest(lake, "r").shards[1].replicas["b"]).unlink()
    killed.write_bytes(b"half a shard")
    _age(killed, STALE_PARTIAL_S + 60)
    plan = plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]})
    assert [(m.action, m.tier) for m in plan.moves] == [("repair", "b")]
    apply_tiers(lake, plan, storage=storage)
    assert not killed.exists()


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_apply_sweeps_stale_temp_files_but_not_a_live_writers(tmp_path) -> None:
    """Overlapping applies (cron) or an export may be publishing into the release's directory while an apply
    finishes: its sweep removes only temp files unwritten for STALE_PARTIAL_S, so the live writer completes."""
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 20)
    storage = cfs_storage(("a", tmp_path / "a"), ("b", tmp_path / "b"))
    manifest = export_table_version(lake, table="samples", version=version, release_name="r", tier="a",
                                    storage=storage, shard_samples=10)
    stale = tmp_path / "b" / "r" / f".{manifest.shards[1].name}.partial-0123456789ab"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"what a writer killed two hours ago left")
    _age(stale, 2 * STALE_PARTIAL_S)

    shard = manifest.shards[0]  # another apply of r into b, in the middle of writing shard 0
    data = Path(shard.replicas["a"]).read_bytes()
    with publish_held_halfway(storage.tier("b"), storage.tier("b").uri("r", shard.name), data):
        live = [p for p in (tmp_path / "b" / "r").iterdir() if p.name.startswith(f".{shard.name}.partial-")]
        assert len(live) == 1
        apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage)
        assert live[0].exists() and not stale.exists()
    assert (tmp_path / "b" / "r" / shard.name).read_bytes() == data
    assert not [p for p in (tmp_path / "b" / "r").iterdir() if ".partial-" in p.name]


def test_sweep_with_older_than_keeps_live_writers_temp_files_on_hdfs_and_cfs(tmp_path, webhdfs) -> None:
    """hdfs: a temp file written to within ``older_than`` stays. cfs: one its writer holds (locked) stays at any age,
    an unlocked one (its writer was killed, just now) goes at once."""
    storage = _storage(tmp_path, webhdfs)
    for name, directory in (("hdfs", webhdfs.root / "datahub/releases/r"), ("cfs", tmp_path / "cfs" / "r")):
        directory.mkdir(parents=True)
        live, old = directory / ".s.tar.partial-0123456789ab", directory / ".t.tar.partial-0123456789ab"
        live.write_bytes(b"a live writer's")
        old.write_bytes(b"a killed writer's")
        _age(old, STALE_PARTIAL_S + 60)
        tier = storage.tier(name)
        with open(live, "ab") as writing:
            fcntl.flock(writing.fileno(), fcntl.LOCK_EX)  # as Tier.publish_stream holds its temp file on cfs
            if name == "cfs":
                _age(live, 2 * STALE_PARTIAL_S)  # stalled, but its writer is alive
                killed = directory / ".u.tar.partial-0123456789ab"
                killed.write_bytes(b"a writer killed 5 s ago")
                _age(killed, 5)
                assert tier.sweep_partials(tier.uri("r"), older_than=STALE_PARTIAL_S) == 2
                assert not killed.exists()
            else:
                assert tier.sweep_partials(tier.uri("r"), older_than=STALE_PARTIAL_S) == 1, name
            assert live.exists() and not old.exists(), name
        if name == "cfs":
            assert tier.sweep_partials(tier.uri("r"), older_than=STALE_PARTIAL_S) == 1 and not live.exists()
        else:
            assert tier.sweep_partials(tier.uri("r"), older_than=0) == 1 and not live.exists(), name


def test_whole_shard_fallback_read_is_charged_to_the_cap_chunk_by_chunk(tmp_path, monkeypatch) -> None:
    """The lineage index of a shard without an embedded index reads the whole shard (tiering._read_verified): the
    cap is charged per chunk as it arrives, before the next one is read, not once for the whole shard after it."""
    from datahub.export.tiering import _read_verified
    from datahub.storage import tier as tier_module
    from datahub.storage.bandwidth import BandwidthCap
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 20)
    storage = cfs_storage(("a", tmp_path / "a"), ("b", tmp_path / "b"))
    export_table_version(lake, table="samples", version=version, release_name="r", tier="a", storage=storage,
                         shard_samples=20)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage)
    manifest = read_lake_manifest(lake, "r")
    shard = manifest.shards[0]
    damaged = bytearray(Path(shard.replicas["a"]).read_bytes())
    damaged[700] ^= 1  # replica a: same size, other bytes: read, refused, then b is read
    Path(shard.replicas["a"]).write_bytes(bytes(damaged))

    monkeypatch.setattr(tier_module, "_CHUNK", 1024)
    read, charged = [0], [0]
    real_chunks = Tier.chunks

    def counted_chunks(self, uri):
        for chunk in real_chunks(self, uri):
            read[0] += len(chunk)
            yield chunk

    def take(self, size: int) -> None:
        assert size <= 1024  # one chunk at a time
        charged[0] += size
        assert charged[0] == read[0]  # charged as it arrives, before anything more is read

    monkeypatch.setattr(Tier, "chunks", counted_chunks)
    monkeypatch.setattr(BandwidthCap, "take", take)
    data = _read_verified(manifest, shard, storage, cap=BandwidthCap(1e12))
    assert bytes(data) == Path(shard.replicas["b"]).read_bytes()
    assert charged[0] == read[0] == 2 * shard.size > 2 * 1024


def test_leftover_delete_spares_a_running_second_tier_export(tmp_path, monkeypatch) -> None:
    """A second-tier export (``export R --tier cold``) journals its shards under cold/R/ before its manifest names
    cold: an apply meanwhile (``tier apply --tiers hot``) saw a leftover and deleted it, and the export then published
    a manifest of deleted replicas. The live journal spares it; once abandoned (an hour unwritten) it goes."""
    import datahub.export.export as export_module
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 60)
    storage = cfs_storage(("cold", str(tmp_path / "cold")), ("hot", str(tmp_path / "hot")))
    export_table_version(lake, table="samples", version=version, release_name="R", tier="hot", storage=storage,
                         shard_samples=20)
    original, plans = export_module.checkpoint, []

    def concurrent_apply(name: str) -> None:
        if name == "export:after_shard:0" and not plans:
            plans.append(plan_tiers(lake, storage=storage, releases=["R"], targets={"R": ["hot"]}))
            assert apply_tiers(lake, plans[0], storage=storage) == []  # the delete was skipped
        original(name)

    monkeypatch.setattr(export_module, "checkpoint", concurrent_apply)
    export_table_version(lake, table="samples", version=version, release_name="R", tier="cold", storage=storage,
                         shard_samples=20, upload_workers=1)
    assert [(m.action, m.tier, m.leftover) for m in plans[0].moves] == [("delete", "cold", True)]
    manifest = read_lake_manifest(lake, "R")
    assert manifest.tiers == ["cold", "hot"]
    assert all(Path(s.replicas["cold"]).stat().st_size == s.size for s in manifest.shards)
    # an abandoned second-tier export (killed, its journal unwritten for an hour) is a leftover again
    monkeypatch.setattr(export_module, "checkpoint", original)
    (tmp_path / "cold2" / "R" / "_partial" / "k").mkdir(parents=True)
    journal = tmp_path / "cold2" / "R" / "_partial" / "k" / "000000.json"
    journal.write_text("{}")
    both = cfs_storage(("cold2", str(tmp_path / "cold2")), ("hot", str(tmp_path / "hot")),
                       ("cold", str(tmp_path / "cold")))
    plan = plan_tiers(lake, storage=both, releases=["R"], targets={"R": ["hot", "cold"]})
    assert [(m.action, m.tier) for m in plan.moves] == [("delete", "cold2")]
    assert apply_tiers(lake, plan, storage=both) == [] and journal.exists()
    old = time.time() - STALE_PARTIAL_S - 60
    os.utime(journal, (old, old))
    assert len(apply_tiers(lake, plan, storage=both)) == 1 and not (tmp_path / "cold2" / "R").exists()


def test_live_writes_on_hdfs_see_a_fresh_journal_not_published_shards(tmp_path, webhdfs) -> None:
    tier = Tier.from_config(_storage(tmp_path, webhdfs), "hdfs")
    tier.publish(tier.uri("R", "R-000000.tar"), b"shard")
    assert tier.live_writes(tier.uri("R"), within=3600) == []
    tier.publish(tier.uri("R", "_partial", "key", "000000.json"), b"{}")
    assert [p.rsplit("/", 1)[-1] for p in tier.live_writes(tier.uri("R"), within=3600)] == ["000000.json"]
    assert tier.live_writes(tier.uri("R"), within=-60) == []
    assert tier.live_writes(tier.uri("nothing"), within=3600) == []


def test_second_tier_export_refuses_to_publish_shards_that_vanished(tmp_path, monkeypatch) -> None:
    """Whatever deletes the second tier's directory during the export (an apply of an older datahub, by hand),
    the export checks its shards are there before the manifest names the tier."""
    import datahub.export.export as export_module
    from datahub.errors import IntegrityError
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 60)
    storage = cfs_storage(("cold", str(tmp_path / "cold")), ("hot", str(tmp_path / "hot")))
    export_table_version(lake, table="samples", version=version, release_name="R", tier="hot", storage=storage,
                         shard_samples=20)
    original = export_module.checkpoint

    def deleted(name: str) -> None:
        if name == "export:after_shard:1":
            for shard in (tmp_path / "cold" / "R").glob("R-*.tar"):
                shard.unlink()
        original(name)

    monkeypatch.setattr(export_module, "checkpoint", deleted)
    with pytest.raises(IntegrityError, match="vanished from tier cold during the export .*re-run the export"):
        export_table_version(lake, table="samples", version=version, release_name="R", tier="cold", storage=storage,
                             shard_samples=20, upload_workers=1)
    assert read_lake_manifest(lake, "R").tiers == ["hot"]
    monkeypatch.setattr(export_module, "checkpoint", original)
    assert export_table_version(lake, table="samples", version=version, release_name="R", tier="cold",
                                storage=storage, shard_samples=20).tiers == ["cold", "hot"]


@pytest.mark.parametrize("token_tier", ["cfs", "hdfs"])
def test_tier_apply_moves_token_files_with_the_release_and_never_leaves_a_named_replica_deleted(
        tmp_path, webhdfs, token_tier) -> None:
    """``export --tokenizer`` writes R/tokens-SHA12/ on a tier the text manifest may not name: apply once took that
    directory for a leftover (or, for a tier it moved the text shards off, deleted it whole) and removed the token
    files their manifest still named; the loader then found no replica. Now token files follow the release: copied
    to its tiers, and removed from a tier its text leaves only after the token manifest dropped that tier (each file
    verified on another tier first: test_token_removal.py); token files exported to a tier the text never was on (a
    token-only replica) stay there."""
    from datahub.export.tokens import export_table_tokens
    from datahub.shards.token_manifest import read_lake_token_manifest, token_dir
    from tests.export.test_tokens import make_lake as make_text_lake, train_tokenizer

    lake, version = make_text_lake(tmp_path / "lake")
    storage = _storage(tmp_path, webhdfs)
    text_tier = "hdfs" if token_tier == "cfs" else "cfs"
    export_table_version(lake, table="samples", version=version, release_name="r", tier=text_tier, storage=storage,
                         shard_samples=30)
    tokens = export_table_tokens(lake, table="samples", version=version, release_name="r", storage=storage,
                                 tokenizer=train_tokenizer(tmp_path / "tok.json"), tier=token_tier, file_tokens=400)
    tier = storage.tier(token_tier)

    def token_files_only_on(tiers: list[str]) -> bool:
        """The lake's token manifest names replicas on ``tiers`` only, each with every part at its size."""
        manifest = read_lake_token_manifest(lake, "r")
        return (manifest is not None and manifest.tiers == tiers
                and all(sorted(record.replicas) == tiers for record in manifest.files)
                and all(storage.tier(t).size(f"{uri}.{part}") == record.part(part).size
                        for record in manifest.files for t, uri in record.replicas.items()
                        for part in ("bin", "idx", "ids")))

    def move_there_and_off() -> None:
        """The release copied to the token tier (text and token files) and moved off again: the planned delete
        takes both."""
        apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": [text_tier, token_tier]}), storage=storage)
        assert read_lake_manifest(lake, "r").tiers == sorted([text_tier, token_tier])
        assert token_files_only_on(sorted([text_tier, token_tier]))
        plan = plan_tiers(lake, storage=storage, targets={"r": [text_tier]})
        assert [(m.action, m.tier, m.leftover, m.token_files) for m in plan.moves] == [
            ("delete", token_tier, False, len(tokens.files))]
        assert len(apply_tiers(lake, plan, storage=storage)) == 1
        assert read_lake_manifest(lake, "r").tiers == [text_tier]
        assert tier.children(tier.uri("r")) == [] and token_files_only_on([text_tier])
        assert plan_tiers(lake, storage=storage, targets={"r": [text_tier]}).moves == ()

    # only token files there (a token-only replica), and a leftover text shard beside them (an interrupted apply):
    # the token files are copied to the release's tier, then the leftover delete takes the shard, not the token files
    tier.publish(tier.uri("r", "r-000000.tar"), b"an old replica")
    plan = plan_tiers(lake, storage=storage, targets={"r": [text_tier]})
    assert [(m.action, m.tier, m.leftover, m.token_files) for m in plan.moves] == [
        ("copy", text_tier, False, len(tokens.files)), ("delete", token_tier, True, 0)]
    assert len(apply_tiers(lake, plan, storage=storage)) == 2
    assert tier.children(tier.uri("r")) == [token_dir(tokens.tokenizer.sha256)]
    assert token_files_only_on(sorted([text_tier, token_tier]))
    assert plan_tiers(lake, storage=storage, targets={"r": [text_tier]}).moves == ()
    move_there_and_off()  # the text on the token tier too, then off it: its token files go with it
    # a leftover text shard alone (an interrupted apply): it goes
    tier.publish(tier.uri("r", "r-000000.tar"), b"an old replica")
    plan = plan_tiers(lake, storage=storage, targets={"r": [text_tier]})
    assert [(m.action, m.tier, m.leftover, m.token_files) for m in plan.moves] == [("delete", token_tier, True, 0)]
    assert len(apply_tiers(lake, plan, storage=storage)) == 1
    assert tier.children(tier.uri("r")) == [] and token_files_only_on([text_tier])
    move_there_and_off()


def test_apply_reports_each_copied_shard_so_a_long_copy_is_not_silent(tmp_path) -> None:
    """A copy or repair of many shards is one move: without a count per shard, `datahub tier apply` printed nothing
    from its start to the end of the move (24 s at --max-mb-s 0.05 for 5 small shards; hours for a large release)."""
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 40)
    storage = cfs_storage(("a", tmp_path / "a"), ("b", tmp_path / "b"))
    export_table_version(lake, table="samples", version=version, release_name="r", tier="a", storage=storage,
                         shard_samples=10)
    calls: list[tuple[str, int, int | None]] = []
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage,
                progress=lambda stage, done, total=None: calls.append((stage, done, total)))
    assert calls == [("r copy -> b: shards", n, 4) for n in range(5)] + [("moves", 1, 1)]
    manifest = read_lake_manifest(lake, "r")
    Path(manifest.shards[2].replicas["b"]).unlink()
    calls.clear()
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage,
                progress=lambda stage, done, total=None: calls.append((stage, done, total)))
    assert calls == [("r repair -> b: shards", 0, 1), ("r repair -> b: shards", 1, 1), ("moves", 1, 1)]


def test_a_shard_missing_on_every_tier_is_named_with_why_and_the_export_that_rewrites_it(tmp_path) -> None:
    """Both replicas of a shard gone: the apply said only `(ceph: export-walk/releases/r/r-000002.tar); re-export the
    release` (s3fs's FileNotFoundError is just the path), neither that it was missing nor which command repairs it."""
    from datahub.errors import IntegrityError
    from tests.export.helpers import cfs_storage

    lake, version = make_lake(tmp_path / "lake", 40)
    storage = cfs_storage(("a", tmp_path / "a"), ("b", tmp_path / "b"))
    export_table_version(lake, table="samples", version=version, release_name="r", tier="a", storage=storage,
                         shard_samples=10)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage)
    for replica in read_lake_manifest(lake, "r").shards[1].replicas.values():
        Path(replica).unlink()
    with pytest.raises(IntegrityError) as failed:
        apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["a", "b"]}), storage=storage)
    message = str(failed.value)
    assert "b: FileNotFoundError:" in message
    assert "`datahub export r --tier a` (with the options of its first export)" in message
