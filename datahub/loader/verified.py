"""Which local shard files were already checked against the manifest's sha256: a verdict store on disk.

A file is known by its identity (device, inode, size, mtime_ns, ctime_ns) plus the expected sha256; an atomic
replacement or an in-place rewrite changes the identity (the ctime also when the mtime is put back, and no call
sets the ctime), so the new bytes are hashed again. A verdict is an empty marker file named by that key in a
store directory: the shard cache's ``.verified`` directory, or by default the user's
(``datahub.settings.cache_home()/datahub/verified``), created private (mode 0700) and refused when another user
could write to it. So a shard is hashed once per file per store ("verified once per shard per cache"), not once
per process: every DataLoader worker, later epochs and later runs of the trainer skip it; a per-file lock makes the
first worker to need a shard hash it while the others wait for its verdict. Removing the store only costs hashing
again; ``verify="always"`` (no store) hashes every read, for bytes changed below the filesystem (disk rot).
Without a usable store directory the verdicts live in a private temporary directory removed with the dataset.
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import stat
import tempfile
import weakref
from collections.abc import Callable

log = logging.getLogger("datahub.loader")

Identity = tuple[int, ...]  # (device, inode, size, mtime_ns, ctime_ns)


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked worker's copy must not delete the directory its parent still uses
        shutil.rmtree(path, ignore_errors=True)


def _touch(marker: str) -> None:
    try:
        with open(marker, "x"):
            pass
    except OSError:  # already there, or the directory is gone: the verdict stays in this process
        pass


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
        marker = self._marker(sha256, identity)
        if marker is not None:
            _touch(marker)
        if replaces is not None and replaces != identity:
            self._seen.discard((sha256, *replaces))
            old = self._marker(sha256, replaces)
            if old is not None:
                for path in (old, old + ".lock"):
                    try:
                        os.unlink(path)
                    except OSError:  # never created here, or already gone
                        pass

    def forget(self, sha256_prefix: str, identity: Identity) -> None:
        """Drop the verdicts on a file that is gone (an evicted cache entry), known by a prefix of its sha256."""
        # prefetch threads add verdicts meanwhile: discard from a snapshot (list() of a set is one step under the GIL)
        # rather than iterate the live set (RuntimeError: set changed size during iteration)
        for key in [key for key in list(self._seen) if tuple(key[1:]) == identity]:
            self._seen.discard(key)
        if self._dir is None:
            return
        suffix = "-" + "-".join(str(part) for part in identity)
        for path in glob.glob(os.path.join(glob.escape(self._dir), glob.escape(sha256_prefix) + "*" + suffix)):
            try:
                os.unlink(path)
            except OSError:  # removed by another process meanwhile
                pass

    def check(self, sha256: str, identity: Identity, matches: Callable[[], bool]) -> bool:
        key = (sha256, *identity)
        if key in self._seen:
            return True
        marker = self._marker(sha256, identity)
        if marker is None:
            return self._hash(key, matches)
        if os.path.exists(marker):  # verified before, by this or another process using the store
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
            if os.path.exists(marker):
                self._seen.add(key)
                return True
            ok = self._hash(key, matches)
            if ok:
                _touch(marker)
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

    def _marker(self, sha256: str, identity: Identity) -> str | None:
        if self._dir is None:
            return None
        return os.path.join(self._dir, f"{sha256[:32]}-" + "-".join(str(part) for part in identity))
