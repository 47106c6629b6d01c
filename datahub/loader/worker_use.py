"""Whether DataLoader worker processes iterate a dataset, as seen from the process that owns it.

A plain torch DataLoader with workers gives each worker a copy of the dataset (fork or pickle), so the
owner's copy never yields anything and its count of consumed samples stays 0. Workers create a marker file
whose (random, private) path the copies share; the owner checks for it. A file rather than shared memory,
because a path survives both fork and pickling (``multiprocessing_context="spawn"``).
"""

from __future__ import annotations

import os
import tempfile
import uuid
import weakref


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked worker's copy must not delete the marker its parent reads
        try:
            os.unlink(path)
        except OSError:
            pass


class WorkerUse:
    """``mark(num_workers)`` in a worker, ``seen()``/``workers()`` in the owner, ``clear()`` when the owner iterates
    itself. The file holds the number of workers, which the owner's state_dict needs to know how the trainer's items
    were split."""

    def __init__(self) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"datahub-loader-workers-{uuid.uuid4().hex}")
        weakref.finalize(self, _remove, self.path, os.getpid())

    def mark(self, num_workers: int = 1) -> None:
        if self.workers() == num_workers:
            return
        try:
            handle = os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                os.write(handle, str(num_workers).encode())
            finally:
                os.close(handle)
        except OSError:  # no writable temp dir: the owner then cannot refuse, as before this check existed
            pass

    def seen(self) -> bool:
        return os.path.exists(self.path)

    def workers(self) -> int | None:
        """The number of DataLoader workers that last iterated the dataset, or None (never, or iterated here since)."""
        try:
            with open(self.path, "rb") as handle:
                text = handle.read().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else 1

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:  # not there (the usual case)
            pass
