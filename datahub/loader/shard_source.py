"""Fetch shard bytes from the preferred storage tier, with checksum, failover and an optional local cache.

A replica that is missing, unreadable, of the wrong size or with the wrong sha256 makes the source try the
next tier at once (logged once per tier, later ones counted in ``failovers``). A tier that does not answer
(connection refused, connect or read timeout, HTTP 5xx: ``errors.replica_error``) is failed over too, logged
once per outage, and tried last for ``ReadPolicy.tier_cooldown_s``; when no tier gave a good replica, the
shard is read again in bounded rounds with backoff (``read_policy``), then ``NoReadableReplicaError`` names
the shard and each tier's cause. A shard is used only whole and verified, so a read that failed half-way
yields nothing and exactly-once holds across failovers.

The cache keeps verified shards under ``cache_dir`` (key = sha256 prefix + name) and evicts least recently
used files (by access time) past ``cache_limit_bytes``. A cache hit is verified like a local replica: size,
then sha256 once per file identity (device, inode, size, mtime, ctime) per verdict store (``verified``: the
cache's ``.verified`` directory or the user's; every process and DataLoader worker using it, in this run and later
ones; a file this process wrote itself counts as verified). Any change made
through the filesystem (a write in place, truncate, rename, or restoring the mtime with utime) sets the
ctime, so the changed file is hashed again; ``verify="always"`` hashes every read (for bytes changed below
the filesystem: disk rot, a server-side change). A corrupted cache file is logged, evicted and fetched again.

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
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from datahub import settings
from datahub.loader.errors import (NoReadableReplicaError, ReplicaUnavailableError, ReplicaUnusableError,
                                   replica_error)
from datahub.shards.manifest import Manifest
from datahub.shards.manifest import ShardRecord as ShardEntry
from datahub.loader.read_policy import DEFAULT_READ_POLICY, ReadPolicy, limit_transport_retries
from datahub.storage.webhdfs import bound_requests
from datahub.loader.verified import VerifiedFiles

Verify = bool | Literal["always"]

log = logging.getLogger("datahub.loader")

ShardBytes = bytes | mmap.mmap  # what ``read`` returns: both support len, the buffer protocol and hashlib
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # populate: map all pages now, no fault per page


def map_file(path: str | os.PathLike[str]) -> ShardBytes:
    """The file's bytes, memory-mapped read-only (an empty file gives b"", as mmap cannot map it)."""
    return _map_file(path)[0]


def _map_file(path: str | os.PathLike[str], *, mapped: bool = True) -> tuple[ShardBytes, tuple[int, ...]]:
    """The bytes (a mapping, or a copy when not ``mapped``) and the file's identity (``_identity``)."""
    with open(path, "rb") as handle:
        stat = os.fstat(handle.fileno())
        identity = _identity(stat)
        if not mapped:
            return handle.read(), identity
        if stat.st_size == 0:
            return b"", identity
        return mmap.mmap(handle.fileno(), stat.st_size, flags=_MAP_FLAGS, prot=mmap.PROT_READ), identity


def default_verdicts_dir(cache_dir: str | os.PathLike[str] | None) -> str:
    """Where sha256 verdicts of local files are kept: ``CACHE_DIR/.verified`` with a shard cache, else the user's
    cache directory (``datahub.settings.cache_home``)."""
    if cache_dir is not None:
        return os.path.join(os.fspath(cache_dir), ".verified")
    return os.path.join(settings.cache_home(), "datahub", "verified")


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    """(device, inode, size, mtime, ctime): the ctime moves on every change made through the filesystem, also
    when the mtime is put back (utime), so an in-place rewrite that keeps size and mtime is still noticed."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


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
        verify: Verify = True,
        read_policy: ReadPolicy | None = None,
        verdicts_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if verify not in (True, False, "always"):
            raise ValueError(f"verify must be True, False or 'always'; got {verify!r}")
        self.manifest = manifest
        self.tier_preference = list(tier_preference) if tier_preference else None
        self.storage = {tier: dict(options) for tier, options in (storage or {}).items()}
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.cache_limit_bytes = cache_limit_bytes
        self.verify = verify
        self.read_policy = read_policy or DEFAULT_READ_POLICY
        self.reads: Counter[tuple[str, str]] = Counter()  # (tier or "cache", shard name) -> times read
        self.failovers: Counter[str] = Counter()  # tier -> replicas that failed
        self.retries = 0  # rounds over a shard's tiers after the first (all tiers failed, some transiently)
        self._filesystems: dict[str, Any] = {}
        self._filesystems_pid = os.getpid()
        # local files whose sha256 matched, by (sha256, device, inode, size, mtime, ctime), kept in a verdict store
        # (``verified``): a later epoch, another DataLoader worker or a later run maps the unchanged file unhashed
        if verdicts_dir is None:
            verdicts_dir = default_verdicts_dir(self.cache_dir)
        self._verified = VerifiedFiles(verdicts_dir, shared=verify is True)
        self._lock = threading.Lock()  # prefetch threads share the tier health below
        self._cooling: dict[str, float] = {}  # tier -> monotonic time until which it is tried last
        self._outages: set[str] = set()  # tiers that failed transiently and have not answered since (logged once)
        self._logged_unusable: set[str] = set()  # tiers whose first bad replica was logged
        self._logged_cache: set[str] = set()  # kinds of cache entry errors logged
        self.hashed: Counter[str] = Counter()  # shard name -> times its bytes were hashed
        self.cache_evictions = 0  # cached shards found corrupt and removed
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)

    def __getstate__(self) -> dict[str, Any]:  # filesystems and the lock do not travel to DataLoader workers
        state = self.__dict__.copy()
        state["_filesystems"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def tiers_for(self, shard: ShardEntry) -> list[str]:
        if self.tier_preference is None:
            return list(shard.replicas)
        return [tier for tier in self.tier_preference if tier in shard.replicas]

    def read(self, shard_index: int) -> bytes:
        """The shard's verified bytes, as a ``bytes`` copy."""
        data = self._read(shard_index, mapped=False)
        return data if isinstance(data, bytes) else bytes(data)

    def read_buffer(self, shard_index: int) -> ShardBytes:
        """The shard's verified bytes without a copy: a read-only mmap for local files, else bytes."""
        return self._read(shard_index, mapped=True)

    def _read(self, shard_index: int, *, mapped: bool) -> ShardBytes:
        shard = self.manifest.shards[shard_index]
        cached = self._cache_get(shard, mapped=mapped)
        if cached is not None:
            return cached
        tiers = self.tiers_for(shard)
        problems: dict[str, str] = {}  # tier -> its last problem
        unusable: set[str] = set()  # tiers whose replica is bad: not tried again for this shard
        policy, started = self.read_policy, time.monotonic()
        for attempt in range(1, policy.attempts + 1):
            for tier in self._by_health([tier for tier in tiers if tier not in unusable]):
                uri = shard.replicas[tier]
                try:
                    data = self._read_replica(shard, tier, uri, mapped=mapped)
                except ReplicaUnusableError as error:
                    unusable.add(tier)
                    problems[tier] = f"{uri}: {error}"
                    self._unusable(shard, tier, str(error), last=len(unusable) == len(tiers))
                    continue
                except ReplicaUnavailableError as error:
                    problems[tier] = f"{uri}: {error}"
                    self._unavailable(shard, tier, str(error))
                    continue
                self._cache_put(shard, data)
                return data
            if len(unusable) == len(tiers) or attempt == policy.attempts:
                break
            self.retries += 1
            time.sleep(policy.delay(attempt))
        skipped = sorted(set(shard.replicas) - set(tiers))
        hint = f"; tiers with a replica but not in tier_preference: {skipped}" if skipped else ""
        tried = "; ".join(f"{tier} ({problem})" for tier, problem in problems.items())
        if not tried:
            tried = "no tier in tier_preference holds a replica"
        elif len(unusable) < len(tiers):
            tried = (f"{tried} (after {attempt} round{'s' if attempt > 1 else ''} over "
                     f"{time.monotonic() - started:.1f} s)")
        raise NoReadableReplicaError(
            f"release {self.manifest.release}: no readable replica of shard {shard.name}: {tried}{hint}. "
            "A tier that did not answer: check that it is up and reachable (endpoint, network) and its storage "
            "options; a bad replica: re-run `datahub export` or `datahub tier` to repair it."
        )

    def _read_replica(self, shard: ShardEntry, tier: str, uri: str, *, mapped: bool) -> ShardBytes:
        """The replica's verified bytes; raises ReplicaUnavailableError or ReplicaUnusableError."""
        try:
            data, identity = self._fetch(tier, uri, mapped=mapped)
        except Exception as error:  # classified by errors.replica_error; anything else is a bug and propagates
            classified = replica_error(error)
            if classified is None:
                raise
            raise classified from error
        self.reads[(tier, shard.name)] += 1
        problem = self._check(shard, data, identity)
        if problem is not None:
            raise ReplicaUnusableError(problem)
        if tier in self._outages:
            with self._lock:
                self._outages.discard(tier)
                self._cooling.pop(tier, None)
            log.info("tier %s answers again (shard %s)", tier, shard.name)
        return data

    def _by_health(self, tiers: list[str]) -> list[str]:
        """``tiers`` with those that did not answer within ``tier_cooldown_s`` moved to the end."""
        now = time.monotonic()
        cooling = [tier for tier in tiers if self._cooling.get(tier, 0.0) > now]
        return [tier for tier in tiers if tier not in cooling] + cooling

    def _unavailable(self, shard: ShardEntry, tier: str, cause: str) -> None:
        with self._lock:
            self.failovers[tier] += 1
            self._cooling[tier] = time.monotonic() + self.read_policy.tier_cooldown_s
            first = tier not in self._outages
            self._outages.add(tier)
        if first:
            others = [other for other in self.tiers_for(shard) if other != tier]
            action = (f"reading from {', '.join(others)} and trying {tier} last for the next "
                      f"{self.read_policy.tier_cooldown_s:g} s" if others else
                      f"retrying up to {self.read_policy.attempts} times in all")
            log.warning("tier %s did not answer reading shard %s (%s); %s; further failures of %s are counted, "
                        "not logged, until it answers again", tier, shard.name, cause, action, tier)

    def _unusable(self, shard: ShardEntry, tier: str, problem: str, *, last: bool) -> None:
        with self._lock:
            self.failovers[tier] += 1
            first = tier not in self._logged_unusable
            self._logged_unusable.add(tier)
        if first:
            log.warning("shard %s: replica on tier %s unusable (%s); %s; further failures on %s are counted, "
                        "not logged", shard.name, tier, problem,
                        "no other tier left" if last else "failing over to the next tier", tier)

    def _fetch(self, tier: str, uri: str, *, mapped: bool) -> tuple[ShardBytes, tuple[int, ...] | None]:
        if "://" not in uri or uri.startswith("file://"):
            path = uri[len("file://") :] if uri.startswith("file://") else uri
            return _map_file(path, mapped=mapped)  # plain POSIX (cfs mount): no fsspec layer and no copy on the hot path
        if self._filesystems_pid != os.getpid():  # a forked DataLoader worker: async filesystems are not fork-safe
            self._filesystems, self._filesystems_pid = {}, os.getpid()
        fs = self._filesystems.get(tier)
        if fs is None:
            import fsspec.core

            fs, _ = fsspec.core.url_to_fs(uri, **self.read_policy.fsspec_options(uri, self.storage.get(tier, {})))
            limit_transport_retries(fs)
            bound_requests(fs, connect_timeout_s=self.read_policy.connect_timeout_s,  # WebHDFS has no timeout
                           read_timeout_s=self.read_policy.read_timeout_s)
            self._filesystems[tier] = fs
        return fs.cat_file(uri), None  # remote bytes are hashed on every read

    def _check(self, shard: ShardEntry, data: ShardBytes, identity: tuple[int, ...] | None) -> str | None:
        if len(data) != shard.size:
            return f"size {len(data)} bytes, manifest says {shard.size}"
        if not (self.verify and shard.sha256):
            return None
        if self.verify == "always":
            identity = None  # hash every read
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
        except OSError as error:  # another user's entry (0600), EIO, ESTALE on an NFS cache: the tiers still serve it
            self._cache_trouble(shard, path, "cannot read", error, "reading the tiers")
            return None
        problem = self._check(shard, data, identity)
        if problem is not None:
            try:
                path.unlink(missing_ok=True)  # a live mapping elsewhere keeps its bytes; the next put replaces the file
            except OSError as error:
                self._cache_trouble(shard, path, "cannot remove the corrupt", error, "reading the tiers")
            self.cache_evictions += 1
            log.warning("shard %s: cached copy %s is corrupt (%s); evicted it, fetching the shard again",
                        shard.name, path, problem)
            return None
        try:
            os.utime(path, ns=(time.time_ns(), identity[3]))  # LRU clock is the access time; mtime stays
            self._remember_verified(shard, path, replaces=identity)  # utime moved the ctime; the bytes are those checked
        except OSError as error:
            # not our file (utime needs the owner) or evicted by another process since we mapped it: the mapped bytes
            # passed the check and outlive an unlink, so use them; only the LRU age and the verdict update are lost
            self._cache_trouble(shard, path, "cannot update the access time of", error,
                                "using the bytes mapped and checked")
        self.reads[("cache", shard.name)] += 1
        return data

    def _cache_trouble(self, shard: ShardEntry, path: Path, what: str, error: OSError, then: str) -> None:
        """Log a cache entry this process cannot use or update, once per kind of error (a shared cache may hold many)."""
        key = f"{what} {type(error).__name__} {error.errno}"
        with self._lock:
            first = key not in self._logged_cache
            self._logged_cache.add(key)
        if first and not isinstance(error, FileNotFoundError):
            log.warning("shard %s: %s cached copy %s (%s); %s; further such cache errors are not logged",
                        shard.name, what, path, error, then)

    def _remember_verified(self, shard: ShardEntry, path: Path, *, replaces: tuple[int, ...] | None = None) -> None:
        """Record ``path``'s current identity as holding ``shard``'s verified bytes (this process put them there or
        changed only its times), forgetting the identity it ``replaces``."""
        if self.verify is True and shard.sha256:
            self._verified.add(shard.sha256, _identity(path.stat()), replaces=replaces)

    def _cache_put(self, shard: ShardEntry, data: ShardBytes) -> None:
        path = self._cache_path(shard)
        if path is None or (self.cache_limit_bytes is not None and len(data) > self.cache_limit_bytes):
            return
        assert self.cache_dir is not None
        temp = None
        try:
            handle, temp = tempfile.mkstemp(dir=self.cache_dir, prefix=".partial-")  # fails in a dir not ours to write
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temp, path)  # atomic: concurrent workers never see a half-written shard
            self._remember_verified(shard, path)  # the bytes just passed _check (after rename: it moves the ctime)
        except OSError as error:
            if temp is not None:
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
                try:
                    stat = entry.stat()
                except OSError:  # evicted by another process since the scan
                    continue
                entries.append((stat.st_atime_ns, stat.st_size, entry.path, _identity(stat)))
        total = sum(size for _, size, _, _ in entries)
        for _, size, path, identity in sorted(entries):
            if total <= self.cache_limit_bytes:
                break
            try:
                Path(path).unlink(missing_ok=True)
            except OSError:  # another user's entry in a shared cache: it stays; its owner's runs evict it
                continue
            self._verified.forget(Path(path).name.split("-", 1)[0], identity)  # the name starts with the sha256's
            total -= size

    def cache_bytes(self) -> int:
        if self.cache_dir is None:
            return 0
        return sum(e.stat().st_size for e in os.scandir(self.cache_dir) if e.is_file())
