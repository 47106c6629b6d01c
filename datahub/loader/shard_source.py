"""Fetch shard bytes from the preferred storage tier, with checksum, failover and an optional local cache.

A replica that is missing, unreadable, of the wrong size or with the wrong sha256 makes the
source try the next tier; the first failover per tier is logged (later ones are counted in
``failovers``), so a dead tier does not flood the trainer log. The cache keeps verified shards
under ``cache_dir`` (key = sha256 prefix + name) and evicts least recently used files (by access time) past
``cache_limit_bytes``. A cache hit is verified like a local replica: size, then sha256 once per file identity
(device, inode, size, mtime) for the dataset's process and its DataLoader workers (``verified``; a file
this process wrote itself counts as verified).
A corrupted cache file is logged, evicted and fetched again from the tiers.

``read_buffer`` (what the loaders use) memory-maps local files (a POSIX path, ``file://`` or a cache
hit) read-only rather than copying them into the process: the decoders read the page cache directly, which saves one full copy of
every shard (the largest single cost after decoding). Replicas and cache entries are replaced
atomically (rename) or unlinked, never rewritten in place, so a live mapping keeps its bytes.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from datahub.loader.errors import NoReadableReplicaError
from datahub.loader.manifest import Manifest, ShardEntry
from datahub.loader.verified import VerifiedFiles

log = logging.getLogger("datahub.loader")

ShardBytes = bytes | mmap.mmap  # what ``read`` returns: both support len, the buffer protocol and hashlib
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # populate: map all pages now, no fault per page


def map_file(path: str | os.PathLike[str]) -> ShardBytes:
    """The file's bytes, memory-mapped read-only (an empty file gives b"", as mmap cannot map it)."""
    return _map_file(path)[0]


def _map_file(path: str | os.PathLike[str], *, mapped: bool = True) -> tuple[ShardBytes, tuple[int, ...]]:
    """The bytes (a mapping, or a copy when not ``mapped``) and the file's identity (device, inode, size, mtime)."""
    with open(path, "rb") as handle:
        stat = os.fstat(handle.fileno())
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if not mapped:
            return handle.read(), identity
        if stat.st_size == 0:
            return b"", identity
        return mmap.mmap(handle.fileno(), stat.st_size, flags=_MAP_FLAGS, prot=mmap.PROT_READ), identity


class ShardSource:
    """Reads whole shards (``read``: bytes; ``read_buffer``: zero-copy); thread-safe for distinct shards."""

    def __init__(
        self,
        manifest: Manifest,
        *,
        tier_preference: Sequence[str] | None = None,
        storage: Mapping[str, Mapping[str, Any]] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        verify: bool = True,
    ) -> None:
        self.manifest = manifest
        self.tier_preference = list(tier_preference) if tier_preference else None
        self.storage = {tier: dict(options) for tier, options in (storage or {}).items()}
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.cache_limit_bytes = cache_limit_bytes
        self.verify = verify
        self.reads: Counter[tuple[str, str]] = Counter()  # (tier or "cache", shard name) -> times read
        self.failovers: Counter[str] = Counter()  # tier -> replicas that failed
        self._filesystems: dict[str, Any] = {}
        self._filesystems_pid = os.getpid()
        # local files whose sha256 matched, by (sha256, device, inode, size, mtime), in this process and its
        # DataLoader workers: a later epoch or another worker maps the same unchanged file without hashing it
        self._verified = VerifiedFiles(shared=verify)
        self.hashed: Counter[str] = Counter()  # shard name -> times its bytes were hashed
        self.cache_evictions = 0  # cached shards found corrupt and removed
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)

    def __getstate__(self) -> dict[str, Any]:  # filesystems do not travel to DataLoader workers
        state = self.__dict__.copy()
        state["_filesystems"] = {}
        return state

    def tiers_for(self, shard: ShardEntry) -> list[str]:
        if self.tier_preference is None:
            return list(shard.replicas)
        return [tier for tier in self.tier_preference if tier in shard.replicas]

    def read(self, shard_index: int) -> bytes:
        """The shard's verified bytes, as a ``bytes`` copy."""
        return self._read(shard_index, mapped=False)  # type: ignore[return-value]

    def read_buffer(self, shard_index: int) -> ShardBytes:
        """The shard's verified bytes without a copy: a read-only mmap for local files, else bytes."""
        return self._read(shard_index, mapped=True)

    def _read(self, shard_index: int, *, mapped: bool) -> ShardBytes:
        shard = self.manifest.shards[shard_index]
        cached = self._cache_get(shard, mapped=mapped)
        if cached is not None:
            return cached
        problems: list[str] = []
        for tier in self.tiers_for(shard):
            uri = shard.replicas[tier]
            try:
                data, identity = self._fetch(tier, uri, mapped=mapped)
                self.reads[(tier, shard.name)] += 1
                problem = self._check(shard, data, identity)
            except (OSError, ValueError) as error:  # FileNotFoundError, permission, network, bad URL
                problem = f"{type(error).__name__}: {error}"
            if problem is None:
                self._cache_put(shard, data)
                return data
            problems.append(f"{tier} ({uri}): {problem}")
            self.failovers[tier] += 1
            if self.failovers[tier] == 1:
                log.warning("shard %s: replica on tier %s unusable (%s); failing over to the next tier; "
                            "further failures on %s are counted, not logged", shard.name, tier, problem, tier)
        skipped = sorted(set(shard.replicas) - set(self.tiers_for(shard)))
        hint = f"; tiers with a replica but not in tier_preference: {skipped}" if skipped else ""
        tried = "; ".join(problems) or "no tier in tier_preference holds a replica"
        raise NoReadableReplicaError(
            f"release {self.manifest.release}: no readable replica of shard {shard.name}: {tried}{hint}. "
            "Check the tier's storage options and re-run `datahub export` or `datahub tier` to repair the replica."
        )

    def _fetch(self, tier: str, uri: str, *, mapped: bool) -> tuple[ShardBytes, tuple[int, ...] | None]:
        if "://" not in uri or uri.startswith("file://"):
            path = uri[len("file://") :] if uri.startswith("file://") else uri
            return _map_file(path, mapped=mapped)  # plain POSIX (cfs mount): no fsspec layer and no copy on the hot path
        if self._filesystems_pid != os.getpid():  # a forked DataLoader worker: async filesystems are not fork-safe
            self._filesystems, self._filesystems_pid = {}, os.getpid()
        fs = self._filesystems.get(tier)
        if fs is None:
            import fsspec.core

            fs, _ = fsspec.core.url_to_fs(uri, **self.storage.get(tier, {}))
            self._filesystems[tier] = fs
        with fs.open(uri, "rb") as handle:
            return handle.read(), None  # remote bytes are hashed on every read

    def _check(self, shard: ShardEntry, data: ShardBytes, identity: tuple[int, ...] | None) -> str | None:
        if len(data) != shard.size:
            return f"size {len(data)} bytes, manifest says {shard.size}"
        if not (self.verify and shard.sha256):
            return None
        expected = shard.sha256
        digests: list[str] = []

        def matches() -> bool:
            self.hashed[shard.name] += 1
            digests.append(self._sha256(data))
            return digests[-1] == expected

        if matches() if identity is None else self._verified.check(expected, identity, matches):
            return None  # remote bytes (no identity) are hashed on every read
        return f"sha256 {digests[-1][:12]}... does not match manifest {expected[:12]}..."

    def _sha256(self, data: ShardBytes) -> str:
        return hashlib.sha256(data).hexdigest()  # releases the GIL: prefetch threads hash in parallel

    # --- local cache -------------------------------------------------------------------------------------

    def _cache_path(self, shard: ShardEntry) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / f"{(shard.sha256 or 'nosha')[:16]}-{shard.name}"

    def _cache_get(self, shard: ShardEntry, *, mapped: bool) -> ShardBytes | None:
        path = self._cache_path(shard)
        if path is None:
            return None
        try:
            data, identity = _map_file(path, mapped=mapped)
        except FileNotFoundError:
            return None
        problem = self._check(shard, data, identity)
        if problem is not None:
            path.unlink(missing_ok=True)  # a live mapping elsewhere keeps its bytes; the next put replaces the file
            self.cache_evictions += 1
            log.warning("shard %s: cached copy %s is corrupt (%s); evicted it, fetching the shard again",
                        shard.name, path, problem)
            return None
        os.utime(path, ns=(time.time_ns(), identity[3]))  # LRU clock is the access time; mtime (identity) stays
        self.reads[("cache", shard.name)] += 1
        return data

    def _remember_verified(self, shard: ShardEntry, path: Path) -> None:
        """Record ``path``'s current identity as holding ``shard``'s verified bytes (this process put them there)."""
        if self.verify and shard.sha256:
            stat = path.stat()
            self._verified.add(shard.sha256, (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns))

    def _cache_put(self, shard: ShardEntry, data: ShardBytes) -> None:
        path = self._cache_path(shard)
        if path is None or (self.cache_limit_bytes is not None and len(data) > self.cache_limit_bytes):
            return
        assert self.cache_dir is not None
        handle, temp = tempfile.mkstemp(dir=self.cache_dir, prefix=".partial-")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            self._remember_verified(shard, Path(temp))  # the bytes just passed _check; rename keeps the identity
            os.replace(temp, path)  # atomic: concurrent workers never see a half-written shard
        except OSError as error:
            Path(temp).unlink(missing_ok=True)
            log.warning("cache dir %s: cannot store shard %s (%s); reading without cache", self.cache_dir, shard.name, error)
            return
        self._evict()

    def _evict(self) -> None:
        if self.cache_limit_bytes is None or self.cache_dir is None:
            return
        entries = []
        for entry in os.scandir(self.cache_dir):
            if entry.is_file() and not entry.name.startswith(".partial-"):
                stat = entry.stat()
                entries.append((stat.st_atime_ns, stat.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.cache_limit_bytes:
                break
            Path(path).unlink(missing_ok=True)
            total -= size

    def cache_bytes(self) -> int:
        if self.cache_dir is None:
            return 0
        return sum(e.stat().st_size for e in os.scandir(self.cache_dir) if e.is_file())
