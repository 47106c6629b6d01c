"""Tier preference, checksum failover with one log line, clear errors, the size-limited cache."""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from datahub.loader.dataset import ReleaseDataset
from datahub.loader.errors import NoReadableReplicaError
from datahub.loader.shard_source import ShardBytes, ShardSource
from tests.loader.shards import all_ids, write_release


@pytest.fixture
def two_tiers(tmp_path: Path) -> dict:
    return write_release(tmp_path, samples_per_shard=(5, 5, 5), tiers=("cfs", "ceph"))


def read_all(tmp_path: Path, **kwargs) -> tuple[ReleaseDataset, list[str]]:
    dataset = ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, shuffle=False, **kwargs)
    return dataset, [s["sample_id"] for s in dataset]


def test_reads_from_the_preferred_tier(tmp_path: Path, two_tiers: dict) -> None:
    dataset, ids = read_all(tmp_path, tier_preference=["ceph", "cfs"])
    assert ids == all_ids(two_tiers)
    assert {tier for tier, _ in dataset.source.reads} == {"ceph"}


def test_one_tier_given_as_a_string_is_that_tier(tmp_path: Path, two_tiers: dict) -> None:
    """tier_preference="ceph" is ["ceph"], not the tiers 'c', 'e', 'p', 'h' (which held no replica)."""
    dataset, ids = read_all(tmp_path, tier_preference="ceph")
    assert ids == all_ids(two_tiers)
    assert {tier for tier, _ in dataset.source.reads} == {"ceph"}


def test_corrupt_and_missing_replicas_fail_over_and_log_once(
    tmp_path: Path, two_tiers: dict, caplog: pytest.LogCaptureFixture
) -> None:
    first = tmp_path / "cfs" / two_tiers["shards"][0]["name"]
    data = bytearray(first.read_bytes())
    data[700] ^= 0xFF  # same size, wrong sha256
    first.write_bytes(bytes(data))
    (tmp_path / "cfs" / two_tiers["shards"][2]["name"]).unlink()
    with caplog.at_level(logging.WARNING, logger="datahub.loader"):
        dataset, ids = read_all(tmp_path, tier_preference=["cfs", "ceph"], prefetch_shards=0)
    assert ids == all_ids(two_tiers)
    lines = [r.getMessage() for r in caplog.records if r.name == "datahub.loader"]
    assert len(lines) == 1 and "sha256" in lines[0] and "cfs" in lines[0]
    assert dataset.source.failovers["cfs"] == 2
    assert dataset.source.reads[("ceph", two_tiers["shards"][0]["name"])] == 1
    assert dataset.source.reads[("cfs", two_tiers["shards"][1]["name"])] == 1


def test_no_readable_replica_names_shard_and_tiers(tmp_path: Path, two_tiers: dict) -> None:
    name = two_tiers["shards"][1]["name"]
    (tmp_path / "cfs" / name).unlink()
    (tmp_path / "ceph" / name).write_bytes(b"truncated")
    with pytest.raises(NoReadableReplicaError) as error:
        read_all(tmp_path, tier_preference=["cfs", "ceph"])
    message = str(error.value)
    assert name in message and "cfs" in message and "FileNotFoundError" in message
    assert "ceph" in message and "size 9 bytes" in message


def test_tier_not_preferred_is_named_in_the_error(tmp_path: Path, two_tiers: dict) -> None:
    shutil.rmtree(tmp_path / "cfs")
    with pytest.raises(NoReadableReplicaError, match=r"not in tier_preference: \['ceph'\]"):
        read_all(tmp_path, tier_preference=["cfs"])


def test_cache_serves_second_epoch_and_respects_size_limit(tmp_path: Path, two_tiers: dict) -> None:
    shard_size = two_tiers["shards"][0]["size"]
    cache = tmp_path / "cache"
    dataset, _ = read_all(tmp_path, cache_dir=cache, cache_limit_bytes=2 * shard_size + 10, prefetch_shards=0)
    assert dataset.source.cache_bytes() <= 2 * shard_size + 10
    assert len([p for p in cache.iterdir() if p.is_file()]) == 2  # the least recently used shard was evicted
    # ... and its verdict with it: the store holds one per cfs replica and per cached file, none for the evicted one
    # (and its .pruned stamp)
    assert len([p for p in (cache / ".verified").iterdir() if p.name != ".pruned"]) == 3 + 2
    last = two_tiers["shards"][2]["name"]
    dataset.source.read(2)
    assert dataset.source.reads[("cache", last)] == 1 and dataset.source.reads[("cfs", last)] == 1
    unlimited, _ = read_all(tmp_path, cache_dir=tmp_path / "cache2")
    shutil.rmtree(tmp_path / "cfs")
    again, ids = read_all(tmp_path, cache_dir=tmp_path / "cache2", tier_preference=["cfs"])
    assert ids == all_ids(two_tiers) and {tier for tier, _ in again.source.reads} == {"cache"}


def test_release_name_resolves_under_lake_exports(tmp_path: Path) -> None:
    write_release(tmp_path / "lake" / "_exports" / "demo-v1", samples_per_shard=(3,))
    dataset = ReleaseDataset("demo-v1", lake=str(tmp_path / "lake"), rank=0, world_size=1)
    assert len(list(dataset)) == 3
    as_path = ReleaseDataset("demo-v1", lake=tmp_path / "lake", rank=0, world_size=1)  # a pathlib.Path, as Lake takes
    assert len(list(as_path)) == 3
    with pytest.raises(Exception, match="without lake="):
        ReleaseDataset("demo-v1", rank=0, world_size=1)


def test_s3_style_replica_through_fsspec_memory(tmp_path: Path) -> None:
    import fsspec

    manifest = write_release(tmp_path, samples_per_shard=(4, 4))
    memory = fsspec.filesystem("memory")
    for shard in manifest["shards"]:
        memory.pipe(f"memory://bucket/{shard['name']}", Path(shard["replicas"]["cfs"]).read_bytes())
        shard["replicas"] = {"ceph": f"memory://bucket/{shard['name']}"}
    dataset = ReleaseDataset(manifest, storage={"ceph": {}}, rank=0, world_size=1)
    assert sorted(s["sample_id"] for s in dataset) == all_ids(manifest)


def test_import_without_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    write_release(tmp_path, samples_per_shard=(3, 2))
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import datahub.loader\n"
        "from datahub.loader import ReleaseDataset\n"
        f"ds = ReleaseDataset({str(tmp_path / 'manifest.json')!r}, rank=0, world_size=1)\n"
        "assert len(list(ds)) == 5 and 'torch' not in str(type(ds).__mro__)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    lazy = "import sys, datahub.loader; assert 'torch' not in sys.modules and 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", lazy], check=True, cwd=Path(__file__).parents[2])


def test_local_shards_are_mapped_and_survive_atomic_replacement(tmp_path: Path) -> None:
    import mmap
    import os

    from datahub.loader.shard_source import map_file

    path = tmp_path / "s.tar"
    path.write_bytes(b"old bytes" * 100)
    mapped = map_file(path)
    assert isinstance(mapped, mmap.mmap) and mapped[:] == b"old bytes" * 100
    replacement = tmp_path / "s.tar.partial"
    replacement.write_bytes(b"new")
    os.replace(replacement, path)  # how tiers and the cache publish: the live mapping keeps the old inode
    assert mapped[:9] == b"old bytes" and map_file(path)[:] == b"new"
    path.unlink()
    assert len(mapped) == 900
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    assert map_file(empty) == b""


def test_unchanged_local_replica_is_hashed_once_per_dataset(tmp_path: Path, two_tiers: dict) -> None:
    import os

    dataset = ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, shuffle=False,
                             tier_preference=["cfs", "ceph"], prefetch_shards=0)
    names = [shard["name"] for shard in two_tiers["shards"]]
    assert [s["sample_id"] for s in dataset] == all_ids(two_tiers)
    dataset.set_epoch(1)
    assert [s["sample_id"] for s in dataset] == all_ids(two_tiers)
    assert all(dataset.source.hashed[name] == 1 for name in names)  # epoch 1 read the files but did not re-hash
    assert all(dataset.source.reads[("cfs", name)] == 2 for name in names)
    first = tmp_path / "cfs" / names[0]
    data = bytearray(first.read_bytes())
    data[700] ^= 0xFF
    first.write_bytes(bytes(data))  # rewritten in place: new mtime/size identity, so it is hashed again
    stat = first.stat()
    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    dataset.set_epoch(2)
    assert [s["sample_id"] for s in dataset] == all_ids(two_tiers)
    assert dataset.source.hashed[names[0]] == 3 and dataset.source.failovers["cfs"] == 1  # cfs twice, then ceph
    assert dataset.source.reads[("ceph", names[0])] == 1


def test_read_copies_and_read_buffer_maps(tmp_path: Path, two_tiers: dict) -> None:
    import mmap

    from datahub.loader.manifest import load_manifest
    from datahub.loader.shard_source import ShardSource

    source = ShardSource(load_manifest(str(tmp_path / "manifest.json")), cache_dir=tmp_path / "cache")
    expected = (tmp_path / "cfs" / two_tiers["shards"][1]["name"]).read_bytes()
    copied = source.read(1)
    assert type(copied) is bytes and copied == expected
    mapped = source.read_buffer(1)  # now a cache hit, mapped from the cache dir
    assert isinstance(mapped, mmap.mmap) and mapped[:] == expected and source.reads[("cache", two_tiers["shards"][1]["name"])] == 1
    assert isinstance(ShardSource(source.manifest).read_buffer(0), mmap.mmap)


def _flip_byte_keeping_size(path: Path, *, keep_mtime: bool) -> None:
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as handle:  # in place: same inode and size
        handle.write(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_corrupt_cache_file_is_detected_evicted_and_fetched_again(
    tmp_path: Path, two_tiers: dict, keep_mtime: bool, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    first, _ = read_all(tmp_path, cache_dir=cache, tier_preference=["cfs"], prefetch_shards=0)
    name = two_tiers["shards"][0]["name"]
    (cached,) = cache.glob(f"*-{name}")
    good = cached.read_bytes()
    _flip_byte_keeping_size(cached, keep_mtime=keep_mtime)
    assert cached.stat().st_size == len(good) and cached.read_bytes() != good
    if keep_mtime:  # a new process (here: a new dataset) hashes every file identity it has not verified itself
        dataset = ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, shuffle=False,
                                 cache_dir=cache, tier_preference=["cfs"], prefetch_shards=0)
    else:  # the same process: an in-place rewrite changes the identity (mtime), so it is hashed again
        dataset = first
        dataset.set_epoch(1)
    with caplog.at_level(logging.WARNING, logger="datahub.loader"):
        ids = [s["sample_id"] for s in dataset]
    assert sorted(ids) == sorted(all_ids(two_tiers))
    assert dataset.source.cache_evictions == 1
    assert any("corrupt" in r.getMessage() and name in r.getMessage() for r in caplog.records)
    assert dataset.source.reads[("cfs", name)] == (2 if dataset is first else 1)  # fetched again from the tier
    assert cached.read_bytes() == good, "the cache holds the verified bytes again"
    others = [shard["name"] for shard in two_tiers["shards"][1:]]
    assert all(dataset.source.reads[("cache", other)] == 1 for other in others)


def test_cache_hit_is_hashed_once_per_cache(tmp_path: Path, two_tiers: dict) -> None:
    """The cache's verdict store (CACHE/.verified) outlives the dataset: a later run trusts the files it put there."""
    cache = tmp_path / "cache"
    first, _ = read_all(tmp_path, cache_dir=cache, prefetch_shards=0)
    names = [shard["name"] for shard in two_tiers["shards"]]
    assert all(first.source.hashed[name] == 1 for name in names)  # the cfs replicas, on their way into the cache
    assert first.source._verified.directory == str(cache / ".verified")
    dataset, _ = read_all(tmp_path, cache_dir=cache, prefetch_shards=0)
    assert all(dataset.source.reads[("cache", name)] == 1 and dataset.source.hashed[name] == 0 for name in names)
    dataset.set_epoch(1)
    list(dataset)
    assert all(dataset.source.reads[("cache", name)] == 2 and dataset.source.hashed[name] == 0 for name in names)
    assert sorted(cache.glob("*.tar")) and not [p for p in (cache / ".verified").iterdir() if p.name.endswith(".lock")]
    assert first.source.cache_bytes() == sum(shard["size"] for shard in two_tiers["shards"])  # the store is no shard


def test_verdicts_persist_across_runs_until_a_file_changes(tmp_path: Path, two_tiers: dict, verdict_store: Path) -> None:
    """A later run (here: another process) skips hashing unchanged local replicas; a changed file is hashed again."""
    import subprocess
    import sys

    first, _ = read_all(tmp_path, tier_preference=["cfs", "ceph"], prefetch_shards=0)
    names = [shard["name"] for shard in two_tiers["shards"]]
    assert all(first.source.hashed[name] == 1 for name in names)
    assert first.source._verified.directory == str(verdict_store)
    code = ("import sys; sys.path.insert(0, '.')\n"
            "from datahub.loader import ReleaseDataset\n"
            f"d = ReleaseDataset({str(tmp_path / 'manifest.json')!r}, rank=0, world_size=1, tier_preference=['cfs'])\n"
            "assert len(list(d)) == 15\n"
            "print(sum(d.source.hashed.values()))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2], capture_output=True,
                         text=True).stdout
    assert out.split() == ["0"], out
    _flip_byte_keeping_size(tmp_path / "cfs" / names[1], keep_mtime=True)  # same inode, size, mtime; new ctime
    again, ids = read_all(tmp_path, tier_preference=["cfs", "ceph"], prefetch_shards=0)
    assert ids == all_ids(two_tiers)
    # the changed cfs copy, then the ceph copy this store had not seen
    assert again.source.hashed == Counter({names[1]: 2}) and again.source.failovers == Counter({"cfs": 1})
    assert again.source.reads[("ceph", names[1])] == 1


def test_verdict_store_writable_by_others_is_not_used(tmp_path: Path, two_tiers: dict) -> None:
    store = tmp_path / "shared-verdicts"
    store.mkdir()
    store.chmod(0o777)  # anyone could forge a verdict here
    dataset, ids = read_all(tmp_path, verdicts_dir=store, prefetch_shards=0)
    assert ids == all_ids(two_tiers) and dataset.source._verified.directory != str(store)
    assert not list(store.iterdir())
    private, _ = read_all(tmp_path, verdicts_dir=tmp_path / "mine", prefetch_shards=0)
    assert private.source._verified.directory == str(tmp_path / "mine")
    assert (tmp_path / "mine").stat().st_mode & 0o777 == 0o700


class HashLog(ShardSource):
    """Appends every sha256 it computes to a file, so hashing in DataLoader worker processes is observable."""

    log_path: Path

    def _sha256(self, data: ShardBytes) -> str:
        digest = super()._sha256(data)
        with open(self.log_path, "a") as log:
            log.write(f"{os.getpid()} {digest}\n")
        return digest


def test_dataloader_workers_hash_each_local_shard_once_across_workers_and_epochs(tmp_path: Path, two_tiers: dict) -> None:
    torch = pytest.importorskip("torch")
    corrupt = tmp_path / "cfs" / two_tiers["shards"][0]["name"]
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a bad verdict is not shared: every worker fails over on its own
    corrupt.write_bytes(bytes(data))
    dataset = ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, batch_size=2, shuffle_buffer=4,
                             tier_preference=["cfs", "ceph"])
    source = dataset.source = HashLog(dataset.manifest, tier_preference=["cfs", "ceph"])
    source.log_path = tmp_path / "hashes.log"
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        ids = [sample["sample_id"] for batch in loader for sample in batch]
        assert sorted(ids) == sorted(all_ids(two_tiers))
    hashes = [line.split() for line in source.log_path.read_text().splitlines()]
    assert {pid for pid, _ in hashes} - {str(os.getpid())}, "the hashing happened in the workers"
    good = Counter(digest for _, digest in hashes if digest in {shard["sha256"] for shard in two_tiers["shards"]})
    assert good == Counter({shard["sha256"]: 1 for shard in two_tiers["shards"]}), "once, not 2 workers x 2 epochs"
    bad = [digest for _, digest in hashes if digest not in good]
    # the corrupt cfs copy: checked in each epoch by the one worker whose piece holds that shard
    assert len(bad) == 2 and len(set(bad)) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_in_place_corruption_keeping_size_and_mtime_is_caught_next_epoch(
    tmp_path: Path, two_tiers: dict, workers: int
) -> None:
    """Same inode, size and mtime (restored with utime): the ctime moved, so the file is hashed again."""
    torch = pytest.importorskip("torch")
    dataset = ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, tier_preference=["cfs", "ceph"],
                             prefetch_shards=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    assert sorted(s["sample_id"] for s in loader) == all_ids(two_tiers)
    name = two_tiers["shards"][1]["name"]
    replica = tmp_path / "cfs" / name
    before = replica.stat()
    _flip_byte_keeping_size(replica, keep_mtime=True)
    after = replica.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    dataset.set_epoch(1)
    ids = Counter(s["sample_id"] for s in loader)
    assert ids == Counter(all_ids(two_tiers)), "every sample once, the damaged shard's from the other tier"
    if workers == 0:  # worker processes keep their own counters
        assert dataset.source.failovers == Counter({"cfs": 1}) and dataset.source.reads[("ceph", name)] == 1


def test_verify_always_hashes_every_read(tmp_path: Path, two_tiers: dict) -> None:
    dataset = ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, verify="always", prefetch_shards=0)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        assert sorted(s["sample_id"] for s in dataset) == all_ids(two_tiers)
    assert all(dataset.source.hashed[shard["name"]] == 2 for shard in two_tiers["shards"])
    with pytest.raises(ValueError, match="verify must be True, False or 'always'"):
        ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, verify="sometimes")


def test_cache_hits_keep_one_verdict_per_file(tmp_path: Path, two_tiers: dict) -> None:
    """A cache hit moves the file's times (LRU clock), so its identity: the old verdict is replaced, not kept."""
    dataset, _ = read_all(tmp_path, cache_dir=tmp_path / "cache", prefetch_shards=0)
    verdicts = Path(dataset.source._verified._dir)
    counts = []
    for epoch in range(1, 4):
        dataset.set_epoch(epoch)
        assert sorted(s["sample_id"] for s in dataset) == all_ids(two_tiers)
        counts.append(len([p for p in verdicts.iterdir() if not p.name.endswith(".lock") and p.name != ".pruned"]))
    names = [shard["name"] for shard in two_tiers["shards"]]
    assert all(dataset.source.reads[("cache", name)] == 3 and dataset.source.hashed[name] == 1 for name in names)
    assert counts == [counts[0]] * 3 and counts[0] <= 2 * len(names)  # the cfs replicas' and the cache files'


def test_default_verdict_store_location(tmp_path: Path, verdict_store: Path) -> None:
    from datahub import settings
    from datahub.loader.shard_source import default_verdicts_dir

    assert default_verdicts_dir(tmp_path / "cache") == str(tmp_path / "cache" / ".verified")
    assert default_verdicts_dir(None) == str(verdict_store)  # XDG_CACHE_HOME/datahub/verified
    assert settings.cache_home({"XDG_CACHE_HOME": "/srv/cache"}) == "/srv/cache"
    home_cache = os.path.join(os.path.expanduser("~"), ".cache")
    assert settings.cache_home({"XDG_CACHE_HOME": "relative/cache"}) == home_cache  # the spec: ignore relative paths
    assert settings.cache_home({}) == home_cache


def test_forget_while_other_threads_add_verdicts(tmp_path: Path) -> None:
    """A cache eviction (forget) on one prefetch thread while another records verdicts (check) never raises, and
    only the evicted file's verdicts go."""
    import sys
    import threading

    from datahub.loader.verified import VerifiedFiles

    store = VerifiedFiles(tmp_path / "store")
    evicted = (1, 1, 10, 1, 1)
    errors: list[BaseException] = []
    stop = threading.Event()

    def add_many() -> None:
        try:
            for n in range(20_000):
                store.check(f"{n:064x}", (2, n, 10, 1, 1), lambda: True)
        except BaseException as error:  # pragma: no cover - the failure this test looks for
            errors.append(error)
        finally:
            stop.set()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        thread = threading.Thread(target=add_many)
        thread.start()
        while not stop.is_set():
            store.add("ab" * 32, evicted)
            try:
                store.forget("abab", evicted)
            except BaseException as error:
                errors.append(error)
                break
        thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert errors == []
    assert store.check("ab" * 32, evicted, lambda: False) is False  # the evicted verdict is gone
    assert store.check(f"{5:064x}", (2, 5, 10, 1, 1), lambda: False) is True  # the others stay


def test_store_without_file_locks_hashes_instead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict store on a filesystem without locks (flock fails, e.g. ENOLCK on NFS without lockd) still
    verifies: the file is hashed, not the read failed."""
    import errno

    from datahub.loader import verified

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(verified.fcntl, "flock", no_locks)
    store = verified.VerifiedFiles(tmp_path / "store")
    hashed: list[int] = []
    assert store.check("cd" * 32, (3, 1, 10, 1, 1), lambda: hashed.append(1) or True) is True
    assert store.check("ef" * 32, (3, 2, 10, 1, 1), lambda: hashed.append(1) or False) is False
    assert hashed == [1, 1]


def _cache_entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_file())


@pytest.mark.parametrize("trouble", ["unreadable", "not_owner", "evicted_after_map", "dir_not_writable"])
def test_cache_entry_errors_fall_back_instead_of_failing_the_read(
    tmp_path: Path, two_tiers: dict, trouble: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache shared with other users or processes: an entry another user wrote (0600: unreadable; or readable but
    not ours, so utime fails), one another process evicts between our map and our utime, or a cache dir we cannot
    write must not end the iteration: the tiers (or the bytes already mapped and checked) serve the shard."""
    import datahub.loader.shard_source as shard_source_module

    cache = tmp_path / "cache"
    read_all(tmp_path, cache_dir=cache, tier_preference=["cfs"], prefetch_shards=0)  # fill the cache
    entries = _cache_entries(cache)
    assert len(entries) == 3
    real_map = shard_source_module._map_file

    def map_file(path: str | os.PathLike[str], *, mapped: bool = True) -> tuple[ShardBytes, tuple[int, ...]]:
        in_cache = Path(path).parent == cache
        if in_cache and trouble == "unreadable":  # as for a non-root reader of another user's 0600 entry
            raise PermissionError(13, "Permission denied", str(path))
        out = real_map(path, mapped=mapped)
        if in_cache and trouble == "evicted_after_map":
            os.unlink(path)  # another process's _evict, between our map and our utime
        return out

    def utime(path: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(1, "Operation not permitted", str(path))  # utime on a file we do not own

    def mkstemp(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(cache / ".partial-x"))

    monkeypatch.setattr(shard_source_module, "_map_file", map_file)
    if trouble == "not_owner":
        monkeypatch.setattr(shard_source_module.os, "utime", utime)
    if trouble in ("unreadable", "dir_not_writable"):  # the tier read then tries to store the shard
        monkeypatch.setattr(shard_source_module.tempfile, "mkstemp", mkstemp)
        if trouble == "dir_not_writable":
            for entry in entries:
                entry.unlink()
    with caplog.at_level(logging.WARNING, logger="datahub.loader"):
        dataset, ids = read_all(tmp_path, cache_dir=cache, tier_preference=["cfs"], prefetch_shards=0)
    assert ids == all_ids(two_tiers)
    names = [shard["name"] for shard in two_tiers["shards"]]
    from_cache = trouble in ("not_owner", "evicted_after_map")  # the mapped bytes passed the check: used as they are
    assert all(dataset.source.reads[("cache", name)] == (1 if from_cache else 0) for name in names)
    assert all(dataset.source.reads[("cfs", name)] == (0 if from_cache else 1) for name in names)
    lines = [r.getMessage() for r in caplog.records if r.name == "datahub.loader" and "cached copy" in r.getMessage()]
    assert len(lines) == (1 if trouble in ("unreadable", "not_owner") else 0), lines  # once, not once per shard
