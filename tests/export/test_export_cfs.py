"""Export to the cfs tier (a local directory): determinism, format, manifest, lineage, resume."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import jsonschema
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.errors import IntegrityError, ReleaseError
from datahub.export import export_table_version, read_lake_manifest
from datahub.shards.tar import RECORD
from datahub.storage.tier import Tier
from tests.export.helpers import cfs_storage, make_lake, publish_held_halfway, samples_table

REPO = Path(__file__).resolve().parents[2]


def _export(lake, version, storage, tier="cfs", release="rel-v1", **kw):
    return export_table_version(lake, table="samples", version=version, release_name=release, tier=tier,
                                storage=storage, **kw)


def test_shards_are_byte_identical_across_runs_and_seeded_order_differs(tmp_path) -> None:
    lake, version = make_lake(tmp_path / "lake", 120)
    storage = cfs_storage(("cfs", tmp_path / "a"), ("other", tmp_path / "b"))
    first = _export(lake, version, storage, shard_samples=25)
    lake2, version2 = make_lake(tmp_path / "lake2", 120)
    second = _export(lake2, version2, storage, tier="other", shard_samples=25)
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in second.shards]
    assert [s.samples for s in first.shards] == [25, 25, 25, 25, 20]
    for shard in first.shards:
        data = Path(shard.replicas["cfs"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (shard.size, shard.sha256)

    seeded = _export(make_lake(tmp_path / "lake3", 120)[0], version, storage, tier="other", release="rel-s",
                     shard_samples=25, shuffle_seed=7)
    import webdataset as wds

    def keys(manifest, tier):
        urls = [s.replicas[tier] for s in manifest.shards]
        return [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False)]

    sorted_keys, seeded_keys = keys(first, "cfs"), keys(seeded, "other")
    assert sorted_keys == sorted(sorted_keys) and len(sorted_keys) == 120
    assert seeded_keys != sorted_keys and sorted(seeded_keys) == sorted_keys
    again = _export(make_lake(tmp_path / "lake4", 120)[0], version, cfs_storage(("other", tmp_path / "c")),
                    tier="other", release="rel-s", shard_samples=25, shuffle_seed=7)
    assert [s.sha256 for s in again.shards] == [s.sha256 for s in seeded.shards]


def test_members_are_readable_by_webdataset_and_tar(tmp_path) -> None:
    import webdataset as wds

    lake, version = make_lake(tmp_path / "lake", 30, with_binary=True)
    manifest = _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs")), shard_samples=10)
    source = {r["sample_id"]: r for r in samples_table(30, with_binary=True).to_pylist()}
    seen = 0
    for sample in wds.WebDataset([s.replicas["cfs"] for s in manifest.shards], shardshuffle=False):
        row = source[sample["__key__"]]
        meta = json.loads(sample["json"])
        assert sample["txt"].decode() == row["text"]
        assert sample["png"] == row["png"]
        assert meta["sample_id"] == row["sample_id"] and meta["source_offset"] == row["source_offset"]
        assert meta["meta"] == json.loads(row["meta"]) and meta["quality"] == row["quality"]
        seen += 1
    assert seen == 30
    names = subprocess.run(["tar", "tf", manifest.shards[0].replicas["cfs"]], capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(names) == 31 and [n.split(".")[0] for n in names[0:3]] == [names[0].split(".")[0]] * 3
    assert names[-1] == "__index__"  # the embedded shard index, which webdataset skipped above as metadata


def test_shard_size_bounds_every_shard_but_the_single_sample_case(tmp_path) -> None:
    lake, version = make_lake(tmp_path / "lake", 200)
    manifest = _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs")), shard_size="40KB")
    assert len(manifest.shards) > 3
    for shard in manifest.shards:  # the whole file, end-of-archive and record padding included
        assert shard.size <= 40_000 and shard.size % RECORD == 0
    assert sum(s.samples for s in manifest.shards) == manifest.num_samples == 200
    assert manifest.shard_pattern == f"rel-v1-{{000000..{len(manifest.shards) - 1:06d}}}.tar"


def test_manifest_matches_schema_loader_contract_and_lake_copy(tmp_path) -> None:
    from datahub.loader.manifest import load_manifest
    from datahub.loader.shard_source import ShardSource

    lake, version = make_lake(tmp_path / "lake", 50)
    manifest = _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs")), shard_samples=20, release_digest="ab" * 32)
    schema = json.loads((REPO / "schemas/manifest.v1.json").read_text())
    on_tier = json.loads((tmp_path / "cfs/rel-v1/manifest.json").read_text())
    jsonschema.validate(on_tier, schema)
    in_lake = json.loads((tmp_path / "lake/_exports/rel-v1/manifest.json").read_text())
    assert in_lake == on_tier and on_tier["release_digest"] == "ab" * 32 and on_tier["table_version"] == version
    loaded = load_manifest("rel-v1", lake=str(tmp_path / "lake"))
    assert loaded.num_samples == 50 and [s.sha256 for s in loaded.shards] == [s.sha256 for s in manifest.shards]
    source = ShardSource(loaded)
    assert source.read(2) == Path(manifest.shards[2].replicas["cfs"]).read_bytes()
    assert not list((tmp_path / "cfs/rel-v1").glob(".*partial*")) and not (tmp_path / "cfs/rel-v1/_partial").exists()


def test_lineage_holds_the_shard_index_and_is_committed_once(tmp_path) -> None:
    lake, version = make_lake(tmp_path / "lake", 40)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    manifest = _export(lake, version, storage, shard_samples=15)
    rows = lake.read("lineage").to_pylist()
    assert len(rows) == 40 and {r["action"] for r in rows} == {"exported"}
    by_shard: dict[str, list[str]] = {}
    for r in rows:
        ref = json.loads(r["ref"])
        assert ref["tier"] == "cfs" and ref["member"] == f"{r['sample_id']}.txt"
        by_shard.setdefault(ref["shard"], []).append(r["sample_id"])
    import webdataset as wds

    for shard in manifest.shards:
        uri = shard.replicas["cfs"]
        assert sorted(by_shard[uri]) == sorted(s["__key__"] for s in wds.WebDataset(uri, shardshuffle=False))
    lineage_version = lake.version("lineage")
    assert _export(lake, version, storage, shard_samples=15) == manifest  # no-op
    assert lake.version("lineage") == lineage_version
    with pytest.raises(ReleaseError, match="other settings"):
        _export(lake, version, storage, shard_samples=16)


def test_crashed_export_publishes_no_manifest_and_resume_skips_verified_shards(tmp_path, monkeypatch) -> None:
    lake, version = make_lake(tmp_path / "lake", 100)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    real_publish = Tier.publish
    writes: list[str] = []
    crash = [True]

    def crash_on_fourth_shard(self, uri, data):
        if uri.endswith(".tar"):
            writes.append(uri.rsplit("/", 1)[-1])
            if crash[0] and len(writes) == 4:
                raise OSError("disk went away")
        return real_publish(self, uri, data)

    monkeypatch.setattr(Tier, "publish", crash_on_fourth_shard)
    with pytest.raises(OSError, match="disk went away"):
        _export(lake, version, storage, shard_samples=10)
    assert not (tmp_path / "cfs/rel-v1/manifest.json").exists() and read_lake_manifest(lake, "rel-v1") is None
    assert not lake.exists("lineage")

    # corrupt the second finished shard: the resume must notice and rebuild it and everything after
    second = tmp_path / "cfs/rel-v1/rel-v1-000001.tar"
    second.write_bytes(b"\0" * second.stat().st_size)
    writes.clear()
    crash[0] = False
    manifest = _export(lake, version, storage, shard_samples=10)
    # every shard from the damaged one on is written again, once (two upload threads: in either order)
    assert sorted(writes) == [f"rel-v1-{i:06d}.tar" for i in range(1, 10)]
    for shard in manifest.shards:
        assert hashlib.sha256(Path(shard.replicas["cfs"]).read_bytes()).hexdigest() == shard.sha256
    assert read_lake_manifest(lake, "rel-v1") == manifest


def test_tables_that_cannot_be_keyed_are_refused(tmp_path) -> None:
    import pyarrow as pa

    from datahub.lake import Lake

    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    lake = Lake(tmp_path / "dup")
    table = samples_table(5)
    version = lake.commit("samples", pa.concat_tables([table, table.slice(0, 1)]), txn="t")
    with pytest.raises(IntegrityError, match="not unique"):
        _export(lake, version, storage)
    lake = Lake(tmp_path / "dots")
    version = lake.commit("samples", table.set_column(0, "sample_id", pa.array(["a.b", "c", "d", "e", "f"])), txn="t")
    with pytest.raises(IntegrityError, match="'a.b' is not a valid shard key"):
        _export(lake, version, storage)


def test_completed_export_sweeps_temp_files_a_killed_upload_left(tmp_path) -> None:
    """A SIGKILL during a CFS publish leaves ``.NAME.partial-HEX``; the next completed export removes it."""
    lake, version = make_lake(tmp_path / "lake", 30)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    release_dir = tmp_path / "cfs/rel-v1"
    release_dir.mkdir(parents=True)
    left = release_dir / ".rel-v1-000001.tar.partial-0123456789ab"
    left.write_bytes(b"half a shard")
    os.utime(left, (time.time() - 10,) * 2)  # its writer was killed a moment ago: the lock it held went with it
    unrelated = release_dir / "notes.partial-0123456789ab"  # not a publish temp name: kept
    unrelated.write_bytes(b"x")
    manifest = _export(lake, version, storage, shard_samples=10)
    assert not left.exists() and unrelated.exists()
    assert sorted(p.name for p in release_dir.glob("*.tar")) == [s.name for s in manifest.shards]


def test_completed_export_leaves_a_concurrent_writers_temp_file_alone(tmp_path) -> None:
    """Nothing stops a second export (or a tier apply) of the release into the same tier meanwhile: the finishing
    export's sweep spares the temp file that writer still holds, and that writer's publish completes."""
    lake, version = make_lake(tmp_path / "lake", 30)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    tier = storage.tier("cfs")
    data = b"another export's shard" * 1000
    release_dir = tmp_path / "cfs" / "rel-v1"
    with publish_held_halfway(tier, tier.uri("rel-v1", "other.tar"), data):
        live = [p for p in release_dir.iterdir() if ".partial-" in p.name]
        assert len(live) == 1
        os.utime(live[0], (time.time() - 7200,) * 2)  # even a writer stalled for two hours keeps its temp file
        _export(lake, version, storage, shard_samples=10)
        assert live[0].exists()
    assert (release_dir / "other.tar").read_bytes() == data


def test_rerun_after_the_lineage_commit_with_other_settings_is_refused(tmp_path, monkeypatch) -> None:
    """Killed after its `exported` lineage commit, before the manifest: a re-run with other shard settings published
    other shards while the lineage (commit skipped as applied) named the first try's; it is refused now, and the
    same settings finish the export with lineage naming the shards that hold each sample."""
    import tarfile

    import pyarrow.compute as pc

    import datahub.export.export as export_module

    lake, version = make_lake(tmp_path / "lake", 60)
    storage = cfs_storage(("hot", tmp_path / "hot"))
    original = export_module.checkpoint

    def killed(name: str) -> None:
        if name == "export:before_manifest":
            raise KeyboardInterrupt("killed before the manifest")
        original(name)

    monkeypatch.setattr(export_module, "checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        export_table_version(lake, table="samples", version=version, release_name="R", tier="hot", storage=storage,
                             shard_samples=10)
    monkeypatch.setattr(export_module, "checkpoint", original)
    with pytest.raises(ReleaseError, match="'R' was half-exported to tier hot with other settings .*first try's"):
        export_table_version(lake, table="samples", version=version, release_name="R", tier="hot", storage=storage,
                             shard_samples=30)
    manifest = export_table_version(lake, table="samples", version=version, release_name="R", tier="hot",
                                    storage=storage, shard_samples=10)
    held = {}
    for shard in manifest.shards:
        with tarfile.open(shard.replicas["hot"]) as tar:
            held.update({member.split(".")[0]: shard.name for member in tar.getnames() if not member.startswith("_")})
    lineage = lake.read("lineage")
    exported = lineage.filter(pc.equal(lineage.column("action"), "exported"))
    assert exported.num_rows == 60
    assert all(held[sample_id] == json.loads(ref)["shard"].rsplit("/", 1)[-1]
               for sample_id, ref in zip(exported.column("sample_id").to_pylist(), exported.column("ref").to_pylist()))


def test_resume_takes_no_journal_of_another_lake_on_a_shared_tier(tmp_path, monkeypatch) -> None:
    """Two lakes (staging, prod) export release R of the same table, version and settings to one tier; lake 1's
    export is killed after shard 0. Lake 2's export took that journal as its own and published lake 1's samples."""
    import tarfile

    import datahub.export.export as export_module
    from datahub.lake import Lake

    storage = cfs_storage(("shared", tmp_path / "shared"))
    first, second = Lake(tmp_path / "lake1"), Lake(tmp_path / "lake2")
    first.commit("samples", samples_table(40), txn="s/1")
    second.commit("samples", samples_table(40, start=1000), txn="s/1")
    version = int(first.table("samples").version())
    assert version == int(second.table("samples").version())
    original = export_module.checkpoint

    def killed(name: str) -> None:
        if name == "export:after_shard:0":
            raise KeyboardInterrupt("lake 1's export killed")
        original(name)

    monkeypatch.setattr(export_module, "checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        export_table_version(first, table="samples", version=version, release_name="R", tier="shared",
                             storage=storage, shard_samples=10, upload_workers=1)
    monkeypatch.setattr(export_module, "checkpoint", original)
    manifest = export_table_version(second, table="samples", version=version, release_name="R", tier="shared",
                                    storage=storage, shard_samples=10)
    mine = set(second.read("samples").column("sample_id").to_pylist())
    for shard in manifest.shards:
        with tarfile.open(shard.replicas["shared"]) as tar:
            assert {m.split(".")[0] for m in tar.getnames() if not m.startswith("_")} <= mine, shard.name


def test_resume_matches_journal_entries_to_shards_by_index_not_by_count(tmp_path, monkeypatch) -> None:
    """A journal whose middle entry does not match the plan (written by a datahub that cut that shard elsewhere) is
    dropped while later entries are kept: the resume rewrote shards from len(done) on, so one kept shard came
    twice and the dropped one never (manifest [0, 2, 3, 4, 4, 5], 10 of 60 samples missing from the lineage)."""
    import datahub.export.export as export_module

    lake, version = make_lake(tmp_path / "lake", 60)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    original = export_module.checkpoint

    def killed(name: str) -> None:
        if name == "export:after_shard:3":
            raise KeyboardInterrupt("killed after shard 3")
        original(name)

    monkeypatch.setattr(export_module, "checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        _export(lake, version, storage, release="rel", shard_samples=10, upload_workers=1)
    monkeypatch.setattr(export_module, "checkpoint", original)
    (journal,) = (tmp_path / "cfs/rel/_partial").iterdir()
    entry = journal / "000001.json"
    row = json.loads(entry.read_text())
    entry.write_text(json.dumps({**row, "start": row["start"] + 1}))  # another plan's boundary, same verified bytes
    assert (journal / "000002.json").exists()

    manifest = _export(lake, version, storage, release="rel", shard_samples=10, upload_workers=1)
    assert [s.name for s in manifest.shards] == [f"rel-{i:06d}.tar" for i in range(6)]
    exported = lake.read("lineage").to_pandas()
    exported = exported[exported.action == "exported"]
    assert len(exported) == 60 and exported.sample_id.nunique() == 60


def test_the_garbage_collector_is_paused_while_shards_are_built_and_restored_after(tmp_path, monkeypatch) -> None:
    """A local export pauses Python's cyclic collector while it spills and builds shards (per-row buffer views set it
    off every few hundred rows), and gives it back as it found it: after a finished export, after a failed one, and
    off when the caller had it off."""
    import gc

    lake, version = make_lake(tmp_path / "lake", 60)
    storage = cfs_storage(("cfs", tmp_path / "cfs"), ("other", tmp_path / "other"))
    real_publish = Tier.publish
    seen: list[bool] = []
    fail = [False]

    def publish(self, uri, data):
        if uri.endswith(".tar"):
            seen.append(gc.isenabled())
            if fail[0]:
                raise OSError("disk went away")
        return real_publish(self, uri, data)

    monkeypatch.setattr(Tier, "publish", publish)
    assert gc.isenabled()
    _export(lake, version, storage, shard_samples=20)
    assert seen == [False, False, False] and gc.isenabled()

    fail[0] = True
    with pytest.raises(OSError, match="disk went away"):
        _export(make_lake(tmp_path / "lake2", 60)[0], version, storage, tier="other", shard_samples=20)
    assert gc.isenabled()

    fail[0] = False
    gc.disable()
    try:
        _export(make_lake(tmp_path / "lake3", 60)[0], version, storage, tier="other", release="rel-v3",
                shard_samples=20)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_shards_go_to_a_cfs_tier_with_o_direct_from_the_export_buffers_as_the_same_bytes(tmp_path, monkeypatch) -> None:
    """A cfs tier (direct_io: auto) writes every shard with O_DIRECT straight from the local export's page-aligned
    buffers, without a copy through the bounce buffer, and the shards are the bytes a buffered tier (off) gets."""
    import datahub.storage.tier as tier_module
    from datahub.storage import validate_storage_config

    if not tier_module._direct_by_default(str(tmp_path)):
        pytest.skip(f"{tmp_path} is not on a local block-device filesystem: direct_io auto writes buffered there")
    monkeypatch.setattr(tier_module, "_DIRECT_MIN", 4096)  # this test's shards are tens of KB, real ones 32 MB+
    bounced: list[int] = []
    real_bounce, real_direct = tier_module._bounce_buffer, tier_module._write_direct
    monkeypatch.setattr(tier_module, "_bounce_buffer", lambda: (bounced.append(1), real_bounce())[1])
    direct: list[tuple[int, int]] = []

    def write_direct(fd, view, *, required):
        direct.append((len(view), real_direct(fd, view, required=required)))
        return direct[-1][1]

    monkeypatch.setattr(tier_module, "_write_direct", write_direct)
    storage = validate_storage_config({"tiers": {
        "direct": {"kind": "cfs", "path": str(tmp_path / "direct")},
        "buffered": {"kind": "cfs", "path": str(tmp_path / "buffered"), "direct_io": "off"}}})
    lake, version = make_lake(tmp_path / "lake", 120, with_binary=True)
    first = _export(lake, version, storage, tier="direct", shard_samples=25)
    assert [size for size, _ in direct] == [s.size for s in first.shards]
    assert [written for _, written in direct] == [s.size - s.size % 4096 for s in first.shards] and not bounced
    direct.clear()
    second = _export(make_lake(tmp_path / "lake2", 120, with_binary=True)[0], version, storage, tier="buffered",
                     shard_samples=25)
    assert not direct
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in second.shards]
    for shard, buffered in zip(first.shards, second.shards):
        data = Path(shard.replicas["direct"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (shard.size, shard.sha256)
        assert data == Path(buffered.replicas["buffered"]).read_bytes()


def test_a_local_export_hashes_its_shards_on_one_thread_started_once(tmp_path, monkeypatch) -> None:
    """The shards of a local export are hashed on one long-lived thread of the export (while each is written), not on
    a thread started per shard; the manifest's sha256s are the shards' bytes."""
    import threading

    started: list[str] = []
    real_start = threading.Thread.start

    def start(self):
        started.append(self.name)
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    lake, version = make_lake(tmp_path / "lake", 120)
    manifest = _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs")), shard_samples=20)
    assert len(manifest.shards) == 6
    assert len([name for name in started if name.startswith("datahub-export-sha256")]) == 1
    for shard in manifest.shards:
        data = Path(shard.replicas["cfs"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard.sha256


def test_a_local_export_spills_member_data_without_tar_headers_and_writes_the_reference_bytes(tmp_path,
                                                                                              monkeypatch) -> None:
    """The spill holds each row's member data alone (no 512-byte headers, no padding): the shard is framed as it is
    built. Edge cases of the framing: empty and null texts, data of exactly a block, null and empty binary values,
    rows from two data files, buffers reused across shards (one upload worker: two buffers for 12 shards)."""
    from datahub.export.samples import encode, prepare
    from datahub.export.spill import BucketSpill
    from datahub.lake import Lake
    from tests.export.test_pipeline import _reference_shards

    lake = Lake(tmp_path / "lake")
    lengths = [0, 1, 511, 512, 513, 1024, 1500, 3000]
    for part in range(2):
        table = samples_table(30, start=30 * part, with_binary=True)
        texts = [None if i % 11 == 3 else "x" * lengths[i % len(lengths)] for i in range(30)]
        images = [None if i % 5 == 0 else bytes([i]) * [0, 512, 1, 1000, 700][i % 5 - 1] for i in range(30)]
        table = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
        table = table.set_column(table.schema.get_field_index("png"), "png", pa.array(images, pa.binary()))
        version = lake.commit("samples", table, txn=f"seed/{part}")
    spilled = [0]
    real_add = BucketSpill.add

    def add(self, buckets, members):
        for part in [members] if isinstance(members, pa.Array) else members:  # a null value adds no bytes
            spilled[0] += int(pc.sum(pc.binary_length(part)).as_py() or 0)
        return real_add(self, buckets, members)

    monkeypatch.setattr(BucketSpill, "add", add)
    manifest = _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs")), shard_samples=5, upload_workers=1)
    whole = prepare(lake.read("samples", version=version), shuffle_seed=None, where="test")
    assert spilled[0] == sum(len(data) for _, members in encode(whole) for _, data in members)
    expected = _reference_shards(whole, shard_size=None, shard_samples=5)
    assert len(manifest.shards) == 12
    assert [Path(s.replicas["cfs"]).read_bytes() for s in manifest.shards] == expected


def test_a_seeded_export_counts_its_rows_from_the_delta_log_and_reads_the_ids_once(tmp_path, monkeypatch) -> None:
    """A seeded export's buckets are ranges of the order hash: only the row count is needed before the rows are
    read, and the Delta log's file statistics give it exactly (live rows: the null count of ``_drop_reason``), so
    no pass over ``sample_id`` is made; the shards are those of an export that counts them by a pass, and bad ids
    are still refused."""
    from datahub.export.source import TableSource
    from datahub.lake import Lake

    lake = Lake(tmp_path / "lake")
    first = samples_table(40)
    lake.commit("samples", first.append_column("_drop_reason", pa.array([None] * 40, pa.string())), txn="a")
    second = samples_table(30, start=40)
    version = lake.commit("samples", second.append_column(
        "_drop_reason", pa.array(["dup" if i % 3 == 0 else None for i in range(30)], pa.string())), txn="b")
    assert TableSource(lake, "samples", version).live_rows() == 60
    with monkeypatch.context() as patched:  # a table with deletion vectors: its statistics count deleted rows
        from types import SimpleNamespace

        from deltalake import DeltaTable

        patched.setattr(DeltaTable, "protocol", lambda self: SimpleNamespace(reader_features=["deletionVectors"]))
        assert TableSource(lake, "samples", version).live_rows() is None
    scans: list[list[str]] = []
    real_scan = TableSource.scan

    def scan(self, columns, **kwargs):
        scans.append(list(columns))
        return real_scan(self, columns, **kwargs)

    monkeypatch.setattr(TableSource, "scan", scan)
    manifest = _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs")), shard_samples=7, shuffle_seed=5)
    assert ["sample_id"] not in scans and len(scans) == 1
    assert manifest.num_samples == 60
    monkeypatch.setattr(TableSource, "live_rows", lambda self: None)  # counted by a pass, as without statistics
    counted = _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs-pass")), shard_samples=7, shuffle_seed=5)
    assert ["sample_id"] in scans
    assert [s.sha256 for s in counted.shards] == [s.sha256 for s in manifest.shards]

    monkeypatch.undo()
    dots = Lake(tmp_path / "dots")
    table = samples_table(5)
    version = dots.commit("samples", table.set_column(0, "sample_id", pa.array(["a.b", "c", "d", "e", "f"])), txn="t")
    with pytest.raises(IntegrityError, match="'a.b' is not a valid shard key"):
        _export(dots, version, cfs_storage(("cfs", tmp_path / "cfs-dots")), shuffle_seed=5)


def test_exporting_again_with_other_settings_names_what_differs_and_the_options_that_match(tmp_path) -> None:
    """`datahub export R --tier ceph` after `datahub export R --tier cfs --shard-samples 40` was refused with the
    whole settings dict of the first export, leaving the user to diff it against options they never wrote down."""
    lake, version = make_lake(tmp_path / "lake", 20)
    storage = cfs_storage(("cfs", tmp_path / "cfs"), ("other", tmp_path / "other"))
    _export(lake, version, storage, shard_samples=15, shuffle_seed=7)
    with pytest.raises(ReleaseError) as refused:
        _export(lake, version, storage, tier="other")
    message = str(refused.value)
    assert "shard_size: 256000000 now, none before" in message
    assert "shard_samples: none now, 15 before" in message
    assert "shuffle_seed: none now, 7 before" in message
    assert "--shard-samples 15 --shuffle-seed 7" in message
