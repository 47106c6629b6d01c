"""Scratch folders on local disk (an export's ``spill_dir``, else TMPDIR): each holds a lock while its owner runs, so
the next one made with the same prefix removes the folders that a killed process left (kill -9 skips every cleanup;
an export's spill, a redact's take-down ids and a sort's runs are the size of the release or of the list) and spares
those of processes running at the same time.

``scratch_dir`` is the folder of a block (an export); ``HeldScratch`` the folder of an object (a ``SortedRuns``, a
redact's ``SortedIds``), removed by ``close()`` or when the object is collected, whichever comes first. A process
sweeps a prefix in a parent folder at its first ``HeldScratch`` there, then again only once ``SWEEP_AGAIN_S`` have
passed since its last sweep there (one listdir of TMPDIR per ten minutes, not one per sort or lookup): what a process
killed before a sweep left is gone then, and what one killed later leaves is swept by the next process to spill there
(each command is one) or, in a long-lived process (a reused Ray worker, a service), by its own first spill ten minutes
on; a forked child (another pid) sweeps again.

The lock is an ``fcntl.flock`` on ``.lock`` inside the folder, taken before the folder gets its swept name (it is
created under a hidden name and renamed), so a sweep never sees a live folder unlocked. A folder without ``.lock``
(an older datahub's) is left alone: nothing tells whether its export still runs.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
SWEEP_AGAIN_S = 600.0  # a process sweeps a prefix's parent again after this long (monotonic seconds)


def _locked_folder(prefix: str, parent: str | None) -> tuple[str, IO[bytes]]:
    """A new folder ``{parent}/{prefix}XXXXXXXX`` and the open handle of its held lock."""
    parent = parent or tempfile.gettempdir()
    hidden = tempfile.mkdtemp(prefix=f".{prefix}", dir=parent)  # not under the swept name until it is locked
    handle = open(os.path.join(hidden, LOCK_NAME), "wb")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        path = os.path.join(parent, os.path.basename(hidden)[1:])
        os.rename(hidden, path)
    except BaseException:
        handle.close()
        shutil.rmtree(hidden, ignore_errors=True)
        raise
    return path, handle


def _remove(path: str, handle: IO[bytes]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    handle.close()  # the lock goes last: a sweep meanwhile sees a live folder


@contextmanager
def scratch_dir(prefix: str, *, parent: str | None = None) -> Iterator[str]:
    """A new folder ``{parent}/{prefix}XXXXXXXX``, locked while the block runs and removed after it."""
    path, handle = _locked_folder(prefix, parent)
    try:
        yield path
    finally:
        _remove(path, handle)


class HeldScratch:
    """A locked scratch folder ``{parent}/{prefix}XXXXXXXX`` (``path``) for an object's spill: removed by ``close()``
    or when this object is collected (keep it as an attribute of its owner); folders of ``prefix`` that killed
    processes left in ``parent`` are swept first, at most once per ``SWEEP_AGAIN_S`` per process (``_sweep_due``)."""

    def __init__(self, prefix: str, *, parent: str | None = None) -> None:
        _sweep_due(prefix, parent or tempfile.gettempdir())
        self.path, handle = _locked_folder(prefix, parent)
        self._finalizer = weakref.finalize(self, _remove, self.path, handle)

    def close(self) -> None:
        self._finalizer()


_swept: dict[tuple[int, str, str], float] = {}  # (pid, prefix, parent) -> when this process last swept there
_swept_lock = threading.Lock()
_clock = time.monotonic  # the sweeps' clock (tests replace it)


def _sweep_due(prefix: str, parent: str) -> None:
    """``sweep_stale`` unless this process (its pid: a forked child is another) swept ``prefix`` in ``parent``
    less than ``SWEEP_AGAIN_S`` ago. What a sweep here could find meanwhile was left by a process killed after this
    one's last sweep: the next process to spill there, or this one's next spill once the time is up, sweeps it."""
    key = (os.getpid(), prefix, os.path.realpath(parent))
    with _swept_lock:
        last = _swept.get(key)
        started = _clock()
        if last is not None and started - last < SWEEP_AGAIN_S:
            return
        sweep_stale(prefix, parent=parent)
        # only once it went through (a failed sweep is tried again); timed from its start, so the window of the next
        # sweep covers a process killed while this one listed
        _swept[key] = started


def sweep_stale(prefix: str, *, parent: str | None = None) -> list[str]:
    """Remove the ``{prefix}*`` folders in ``parent`` whose lock nobody holds (their process was killed); returns
    their paths. A running process holds its folder's lock, so concurrent ones are not harmed."""
    parent = parent or tempfile.gettempdir()
    try:
        names = sorted(n for n in os.listdir(parent) if n.startswith(prefix))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        path = os.path.join(parent, name)
        try:
            handle = open(os.path.join(path, LOCK_NAME), "rb")
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue  # gone meanwhile, not a folder, an older datahub's, or another user's
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a running process's
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.info("removed %d scratch folder(s) of killed processes in %s: %s", len(removed), parent,
                 ", ".join(os.path.basename(p) for p in removed))
    return removed
