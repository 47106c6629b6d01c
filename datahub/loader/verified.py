"""Which local shard files were already checked against the manifest's sha256: a verdict store on disk.

A file is known by its identity (device, inode, size, mtime_ns, ctime_ns) plus the expected sha256; an atomic
replacement or an in-place rewrite changes the identity (the ctime also when the mtime is put back, and no call
sets the ctime), so the new bytes are hashed again. A verdict is a marker file named by the identity and holding
the sha256 (it counts for that sha256 only) in a store directory: the shard cache's ``.verified`` directory, or by
default the user's (``datahub.settings.cache_home()/datahub/verified``), created private (mode 0700) and refused
when another user could write to it. So a shard is hashed once per file per store ("verified once per shard per
cache"), not once per process: every DataLoader worker, later epochs and later runs of the trainer skip it; a
per-file lock makes the first worker to need a shard hash it while the others wait for its verdict. Removing the
store only costs hashing again; ``verify="always"`` (no store) hashes every read, for bytes changed below the
filesystem (disk rot). Without a usable store directory the verdicts live in a private temporary directory removed
with the dataset.

An evicted cache file's verdict is removed by name (its identity), without listing the store. The store is pruned
at most once a day (the ``.pruned`` stamp; the first dataset opened after that does it, one listing of the store):
verdicts unused for ``PRUNE_UNUSED_S`` (30 days; a verdict read is re-dated when over a day old) go, as do lock
files a killed process left and markers of the older format (named by sha256 prefix and identity). A
marker names no path, so whether its file still exists cannot be told: age is the rule. Pruning never makes a
wrong verdict, it only costs hashing again.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
import time
import weakref
from collections.abc import Callable

log = logging.getLogger("datahub.loader")

Identity = tuple[int, ...]  # (device, inode, size, mtime_ns, ctime_ns)


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked worker's copy must not delete the directory its parent still uses
        shutil.rmtree(path, ignore_errors=True)


# A verdict not used for 30 days goes at the next pruning (costs one hash if its file is read again); one in use is
# re-dated when read, at most once a day, so it never gets that old. Pruning runs at most once a day per store.
PRUNE_UNUSED_S = 30 * 86_400
PRUNE_EVERY_S = 86_400
_STAMP = ".pruned"
# The only names pruning may remove: ``verdicts_dir`` is the user's to choose, and may hold other files.
_VERDICT = re.compile(r"-?\d+(--?\d+){4}(\.lock)?")  # identity parts joined by '-' (a check's lock: + .lock)
_OLD_FORMAT = re.compile(r"[0-9a-f]{32}(--?\d+){5}(\.lock)?")  # sha256 prefix + identity, an empty file (before)


def _record(marker: str, sha256: str) -> None:
    """Write the verdict. A reader that meets it half-written (or a killed writer's part) finds no match and hashes
    the file itself: a marker counts only when it holds the whole expected sha256."""
    try:
        with open(marker, "w") as handle:
            handle.write(sha256)
    except OSError:  # the directory is gone: the verdict stays in this process
        pass


def _recorded(marker: str) -> str | None:
    """The sha256 a marker holds (None: no verdict); re-dates a marker last dated over a day ago (in use)."""
    try:
        with open(marker) as handle:
            sha256 = handle.read(80)
            if time.time() - os.fstat(handle.fileno()).st_mtime > PRUNE_EVERY_S:
                os.utime(marker)
    except OSError:
        return None
    return sha256


def prune_store(directory: str, *, now: float | None = None) -> int | None:
    """Remove the verdicts of ``directory`` unused for ``PRUNE_UNUSED_S``, leftover lock files older than a day and
    markers of the older format (only names this module writes, regular files: anything else in the directory
    stays), unless the store was pruned within ``PRUNE_EVERY_S`` (or is being pruned now); returns how many
    entries were removed, or None when it was not due. Concurrent prunes are safe (each removal is an idempotent
    unlink; the stamp's lock keeps them to one pass)."""
    now = time.time() if now is None else now
    stamp = os.path.join(directory, _STAMP)
    try:
        if now - os.stat(stamp).st_mtime < PRUNE_EVERY_S:
            return None  # the common case: one stat
    except FileNotFoundError:
        pass
    fd = os.open(stamp, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another process is pruning
        except OSError:  # no locks here (NFS without lockd): prune anyway, it is idempotent
            pass
        if now - os.fstat(fd).st_mtime < PRUNE_EVERY_S and os.fstat(fd).st_size:
            return None  # pruned by another process since the stat above
        os.write(fd, b"1")  # the stamp: non-empty once a pass ran, dated by this pass
        os.utime(fd, (now, now))
        removed = 0
        with os.scandir(directory) as entries:
            for entry in entries:
                old_format = _OLD_FORMAT.fullmatch(entry.name) is not None
                if not (old_format or _VERDICT.fullmatch(entry.name)):
                    continue  # not a name this module writes (the stamp, or a file of the user's): never removed
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(info.st_mode):
                    continue
                age = now - info.st_mtime
                lock = entry.name.endswith(".lock")  # a check's lock: seconds old when in use
                if old_format or age > (PRUNE_EVERY_S if lock else PRUNE_UNUSED_S):
                    try:
                        os.unlink(entry.path)
                        removed += 1
                    except OSError:  # removed meanwhile
                        pass
        return removed
    finally:
        os.close(fd)


def _private_store(directory: str) -> str | None:
    """``directory`` created (mode 0700) if missing, when it is a directory only this user can write; else None."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.stat(directory)
    except OSError as error:
        log.debug("verdict store %s unusable (%s); verdicts kept for this dataset only", directory, error)
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        log.warning("verdict store %s is not a directory of this user's that only it can write; sha256 verdicts "
                    "are kept for this dataset only (fix its owner or mode to keep them across runs)", directory)
        return None
    return directory


class VerifiedFiles:
    """``check(sha256, identity, matches)``: True when the file holds those bytes, calling ``matches`` only when no
    process using the same store has verified that identity yet.

    ``directory``: the verdict store (kept); None or unusable: a private temporary directory, removed with this
    object (shared with DataLoader workers forked or spawned from it); ``shared=False``: verdicts in this process
    only."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, shared: bool = True) -> None:
        self._seen: set[tuple[object, ...]] = set()
        self._dir: str | None = None
        if shared and directory is not None:
            self._dir = _private_store(os.fspath(directory))
            if self._dir is not None:
                try:
                    removed = prune_store(self._dir)
                except OSError as error:
                    log.debug("verdict store %s: not pruned (%s)", self._dir, error)
                else:
                    if removed:
                        log.info("verdict store %s: pruned %d old entries", self._dir, removed)
        if shared and self._dir is None:
            try:
                self._dir = tempfile.mkdtemp(prefix="datahub-verified-")  # mode 0700: only this user writes verdicts
            except OSError as error:
                log.debug("no shared verification directory (%s); each DataLoader worker hashes its shards", error)
            else:
                weakref.finalize(self, _remove, self._dir, os.getpid())

    @property
    def directory(self) -> str | None:
        """Where the verdicts are kept (None: in this process only)."""
        return self._dir

    def add(self, sha256: str, identity: Identity, *, replaces: Identity | None = None) -> None:
        """Record a file this process wrote from verified bytes, or whose metadata it changed itself (``replaces``:
        the identity it had, forgotten so that verdicts do not pile up, one per touch)."""
        self._seen.add((sha256, *identity))
        marker = self._marker(identity)
        if marker is not None:
            _record(marker, sha256)
        if replaces is not None and replaces != identity:
            self._seen.discard((sha256, *replaces))
            old = self._marker(replaces)
            if old is not None:
                for path in (old, old + ".lock"):
                    try:
                        os.unlink(path)
                    except OSError:  # never created here, or already gone
                        pass

    def forget(self, sha256_prefix: str, identity: Identity) -> None:
        """Drop the verdicts on a file that is gone (an evicted cache entry): its marker, by name (a verdict is
        named by the file's identity; ``sha256_prefix``, the one in a cache file's name, is not needed for it)."""
        # prefetch threads add verdicts meanwhile: discard from a snapshot (list() of a set is one step under the GIL)
        # rather than iterate the live set (RuntimeError: set changed size during iteration)
        for key in [key for key in list(self._seen) if tuple(key[1:]) == identity]:
            self._seen.discard(key)
        marker = self._marker(identity)
        if marker is not None:
            try:
                os.unlink(marker)
            except OSError:  # never verified here, or removed by another process meanwhile
                pass

    def check(self, sha256: str, identity: Identity, matches: Callable[[], bool]) -> bool:
        key = (sha256, *identity)
        if key in self._seen:
            return True
        marker = self._marker(identity)
        if marker is None:
            return self._hash(key, matches)
        if _recorded(marker) == sha256:  # verified before, by this or another process using the store
            self._seen.add(key)
            return True
        try:
            lock = os.open(marker + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:  # the directory was removed (the dataset that created it is gone): verify alone
            return self._hash(key, matches)
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another worker hashing this file finishes first
            except OSError as error:  # no locks on this filesystem (e.g. ENOLCK on NFS without lockd): verify alone
                log.debug("verdict store %s: no lock (%s); hashing without it", self._dir, error)
                return self._hash(key, matches)
            if _recorded(marker) == sha256:
                self._seen.add(key)
                return True
            ok = self._hash(key, matches)
            if ok:
                _record(marker, sha256)
            try:  # one file per verdict: a process that opens the path anew finds the marker (or hashes itself)
                os.unlink(marker + ".lock")
            except OSError:
                pass
            return ok
        finally:
            os.close(lock)  # releases the lock

    def _hash(self, key: tuple[object, ...], matches: Callable[[], bool]) -> bool:
        ok = matches()
        if ok:
            self._seen.add(key)
        return ok

    def _marker(self, identity: Identity) -> str | None:
        """The verdict on the file with this identity: ``DEV-INODE-SIZE-MTIME-CTIME`` in the store."""
        if self._dir is None:
            return None
        return os.path.join(self._dir, "-".join(str(part) for part in identity))
