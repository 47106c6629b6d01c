"""Files a live process holds with a shared ``flock``, and the sweep that removes those of dead processes.

The loader's shared-memory rings (``worker_transport``) and its owner files (``worker_use``) follow one rule: the
process that makes such a file holds a shared flock on it while it lives, so an exclusive flock is granted only
once it is gone. The kernel drops a dead process's lock whatever its PID namespace, so a job in another container
sharing the directory keeps its files, where a PID in the name would mean nothing there.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def create_held(new_path: Callable[[], str], *, flags: int = os.O_RDONLY) -> tuple[str, int]:
    """A new file at ``new_path()`` (a name with a random part) and its descriptor, holding a shared flock for this
    process's life. A sweep between the creation and the lock takes the file: then another name is made."""
    while True:
        path = new_path()
        handle = os.open(path, os.O_CREAT | os.O_EXCL | flags, 0o600)
        try:
            fcntl.flock(handle, fcntl.LOCK_SH)  # waits while a sweep holds it: it then unlinks the file
            if os.fstat(handle).st_ino == os.stat(path).st_ino:
                return path, handle
        except FileNotFoundError:  # a sweep took the file between its creation and the lock: make another
            pass
        except OSError:
            os.close(handle)
            unlink_quietly(path)
            raise
        os.close(handle)


def remove_if_unheld(path: str, remove: Callable[[], None]) -> bool:
    """Run ``remove`` (which unlinks ``path``, and whatever belongs to it) while holding an exclusive flock on
    ``path``, if one is granted at once: no live process holds the file. Returns whether it ran."""
    try:
        handle = os.open(path, os.O_RDONLY)
    except OSError:  # gone meanwhile, or another user's file: not ours to judge
        return False
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process lives (in this PID namespace or another)
            return False
        remove()  # the name has a random part, so it is still the file locked here
        return True
    finally:
        os.close(handle)  # drops the lock
