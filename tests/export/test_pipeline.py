"""Export internals that must not change bytes or order: Arrow tar framing and pipelined uploads."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import datahub.export.export as export_module
from datahub.errors import IntegrityError, SpecError
from datahub.export import export_table_version, read_lake_manifest
from datahub.export.samples import encode, prepare
from datahub.export.export import index_reserve
from datahub.shards.tar import RECORD, end_of_archive, header, member_blocks, member_bytes
from datahub.shards.index import _index_general, index_member
from datahub.storage.tier import Tier
from tests.export.helpers import cfs_storage, make_lake, samples_table


def _export(lake, version, storage, release="rel-v1", **kw):
    return export_table_version(lake, table="samples", version=version, release_name=release, tier="cfs",
                                storage=storage, **kw)


def _reference_shards(table: pa.Table, *, shard_size: int | None, shard_samples: int | None) -> list[bytes]:
    """The per-row writer the export used before Arrow framing: member_bytes per member, same cut rule
    (members, the bound on the index member and the end blocks fit in the size), then the index member."""

    def close(parts: list[bytes]) -> bytes:
        members = b"".join(parts)
        embedded = index_member(_index_general(members, "reference"), len(members))
        assert embedded, "every exported shard embeds its index"
        return members + embedded + end_of_archive(len(members) + len(embedded))

    shards, parts, written, count = [], [], 0, 0
    for key, members in encode(table):
        sample = b"".join(member_bytes(f"{key}.{ext}", payload) for ext, payload in members)
        total = written + len(sample)
        full = (shard_samples is not None and count >= shard_samples) or (
            shard_size is not None and total + index_reserve(total, count + 1) + 1024 > shard_size // RECORD * RECORD)
        if count and full:
            shards.append(close(parts))
            parts, written, count = [], 0, 0
        parts.append(sample)
        written += len(sample)
        count += 1
    if count:
        shards.append(close(parts))
    return shards


@pytest.mark.parametrize("settings", [{"shard_samples": 7}, {"shard_size": 10240}, {"shard_size": 20000},
                                      {"shard_size": 25000, "shard_samples": 5}])
def test_shards_equal_the_per_row_reference_writer(tmp_path, settings) -> None:
    lake, version = make_lake(tmp_path / "lake", 150, with_binary=True)
    manifest = _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs")), **settings)
    table = prepare(lake.read("samples", version=version), shuffle_seed=None, where="test")
    expected = _reference_shards(table, shard_size=settings.get("shard_size"), shard_samples=settings.get("shard_samples"))
    assert [Path(s.replicas["cfs"]).read_bytes() for s in manifest.shards] == expected
    assert [s.sha256 for s in manifest.shards] == [hashlib.sha256(b).hexdigest() for b in expected]


def test_member_blocks_equal_header_and_refuse_what_header_refuses() -> None:
    names = ["a.txt", "k" * 95 + ".json", "id_-9.png", "x.y"]
    sizes = np.array([0, 8**11 - 1, 513, 1024])
    blocks = member_blocks(pa.array(names), sizes)
    assert [b.as_py() for b in blocks] == [header(n, int(s)) for n, s in zip(names, sizes)]
    with pytest.raises(IntegrityError, match="not allowed"):
        member_blocks(pa.array(["ok.txt", "a/b.txt"]), np.array([1, 1]))
    with pytest.raises(IntegrityError, match="does not fit"):
        member_blocks(pa.array(["ok.txt"]), np.array([8**11]))


def test_next_shard_is_built_while_the_previous_uploads_and_manifest_comes_last(tmp_path, monkeypatch) -> None:
    lake, version = make_lake(tmp_path / "lake", 60)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    built_second = threading.Event()
    real_build, real_publish = export_module._build_shards, Tier.publish
    events: list[str] = []

    def build(*args, **kwargs):
        for shard in real_build(*args, **kwargs):
            if shard.index == 1:
                built_second.set()
            yield shard

    def publish(self, uri, data):
        name = uri.rsplit("/", 1)[-1]
        if name == "rel-v1-000000.tar":  # only finishes if shard 1 gets built meanwhile
            assert built_second.wait(timeout=10), "shard 1 was not built while shard 0 uploaded"
        events.append(name)
        return real_publish(self, uri, data)

    monkeypatch.setattr(export_module, "_build_shards", build)
    monkeypatch.setattr(Tier, "publish", publish)
    manifest = _export(lake, version, storage, shard_samples=10, upload_workers=1)
    shards = [f"rel-v1-{i:06d}.tar" for i in range(6)]
    assert [e for e in events if e.endswith(".tar")] == shards  # one upload worker: shard order
    assert events[-1] == "manifest.json" and events.count("manifest.json") == 1
    assert events.index("manifest.json") > max(events.index(s) for s in shards)
    assert read_lake_manifest(lake, "rel-v1") == manifest
    assert not (tmp_path / "cfs/rel-v1/_partial").exists()


def test_parallel_uploads_overlap_fail_cleanly_and_resume_to_the_same_bytes(tmp_path, monkeypatch) -> None:
    clean_lake, clean_version = make_lake(tmp_path / "clean-lake", 100)
    clean = _export(clean_lake, clean_version, cfs_storage(("cfs", tmp_path / "clean")), shard_samples=10)
    lake, version = make_lake(tmp_path / "lake", 100)
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    real_publish = Tier.publish
    lock, active, peak, fail = threading.Lock(), [0], [0], [True]
    overlapped = threading.Event()

    def publish(self, uri, data):
        if uri.endswith(".tar"):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
                if active[0] >= 2:
                    overlapped.set()
            try:
                # the first upload waits for a second one to start, so the overlap is shown whatever the machine's
                # speed (a fixed 50 ms sleep left it to the builder outpacing the upload: a loaded machine that
                # takes longer per shard saw peak 1)
                if fail[0] and uri.endswith("-000000.tar"):
                    overlapped.wait(timeout=30)
                if fail[0] and uri.endswith("-000006.tar"):
                    raise OSError("link down")
                return real_publish(self, uri, data)
            finally:
                with lock:
                    active[0] -= 1
        return real_publish(self, uri, data)

    monkeypatch.setattr(Tier, "publish", publish)
    with pytest.raises(OSError, match="link down"):
        _export(lake, version, storage, shard_samples=10, upload_workers=3)
    assert peak[0] >= 2  # uploads ran concurrently
    assert not (tmp_path / "cfs/rel-v1/manifest.json").exists() and read_lake_manifest(lake, "rel-v1") is None
    fail[0] = False
    resumed = _export(lake, version, storage, shard_samples=10, upload_workers=3)
    assert [(s.name, s.sha256, s.size) for s in resumed.shards] == [(s.name, s.sha256, s.size) for s in clean.shards]
    for shard in resumed.shards:
        assert hashlib.sha256(Path(shard.replicas["cfs"]).read_bytes()).hexdigest() == shard.sha256


def test_upload_workers_must_be_positive(tmp_path) -> None:
    lake, version = make_lake(tmp_path / "lake", 5)
    with pytest.raises(SpecError, match="upload_workers"):
        _export(lake, version, cfs_storage(("cfs", tmp_path / "cfs")), upload_workers=0)


def test_member_blocks_equal_header_on_many_names() -> None:
    """Names of every length 1-100 and every printable character but '/', sizes across the octal range, a sliced
    array: each block is ``header``'s; a '..' or a bad byte in any one name is refused as ``header`` refuses it."""
    rng = np.random.default_rng(5)
    alphabet = [chr(c) for c in range(0x20, 0x7F) if chr(c) not in "/."]
    names = ["".join(rng.choice(alphabet, int(k))) + ".e" for k in rng.integers(0, 99, 3000)]
    sizes = rng.integers(0, 8**11, 3000)
    sizes[:100] = rng.integers(0, 1024, 100)
    array = pa.array(["skip.me", *names])[1:]
    assert [b.as_py() for b in member_blocks(array, sizes)] == [header(n, int(s)) for n, s in zip(names, sizes)]
    for bad in ("a..b", "caf\u00e9", "tab\there", "x" * 101):
        with pytest.raises(IntegrityError, match="not allowed"):
            member_blocks(pa.array([*names[:5], bad]), np.ones(6, dtype=np.int64))
