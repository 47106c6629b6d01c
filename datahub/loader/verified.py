"""Which local shard files were already checked against the manifest's sha256, shared by DataLoader workers.

A file is known by its identity (device, inode, size, mtime_ns, ctime_ns) plus the expected sha256; an atomic
replacement or an in-place rewrite changes the identity (the ctime also when the mtime is put back), so the new
bytes are hashed again. Results are kept in this process
and, through a private marker directory created with the dataset, in every DataLoader worker forked or spawned
from it: a per-file lock makes the first worker to need a shard hash it while the others wait for its verdict,
so two workers hash each shard once, not twice, and the workers of the next epoch do not hash it at all.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
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


class VerifiedFiles:
    """``check(sha256, identity, matches)``: True when the file holds those bytes, calling ``matches`` only when no
    process of this dataset has verified that identity yet."""

    def __init__(self, *, shared: bool = True) -> None:
        self._seen: set[tuple[object, ...]] = set()
        self._dir: str | None = None
        if shared:
            try:
                self._dir = tempfile.mkdtemp(prefix="datahub-verified-")  # mode 0700: only this user writes verdicts
            except OSError as error:
                log.debug("no shared verification directory (%s); each DataLoader worker hashes its shards", error)
        if self._dir is not None:
            weakref.finalize(self, _remove, self._dir, os.getpid())

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

    def check(self, sha256: str, identity: Identity, matches: Callable[[], bool]) -> bool:
        key = (sha256, *identity)
        if key in self._seen:
            return True
        marker = self._marker(sha256, identity)
        if marker is None:
            return self._hash(key, matches)
        try:
            lock = os.open(marker + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:  # the directory was removed (the dataset that created it is gone): verify alone
            return self._hash(key, matches)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker hashing this file finishes first
            if os.path.exists(marker):
                self._seen.add(key)
                return True
            ok = self._hash(key, matches)
            if ok:
                _touch(marker)
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
