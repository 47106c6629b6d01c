"""An export's scratch folders on local disk (``spill_dir``, else TMPDIR): each holds a lock while its export runs, so
the next export removes the folders that a killed one left (kill -9 skips every cleanup; a Ray export's runs are
the size of the release) and spares those of exports running at the same time.

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
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

EXPORT_PREFIX = "datahub-export-"
TOKENS_PREFIX = "datahub-tokens-"
LOCK_NAME = ".lock"


@contextmanager
def scratch_dir(prefix: str, *, parent: str | None = None) -> Iterator[str]:
    """A new folder ``{parent}/{prefix}XXXXXXXX``, locked while the block runs and removed after it."""
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
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        handle.close()  # the lock goes last: a sweep meanwhile sees a live folder


def sweep_stale(prefix: str, *, parent: str | None = None) -> list[str]:
    """Remove the ``{prefix}*`` folders in ``parent`` whose lock nobody holds (their export was killed); returns
    their paths. A running export holds its folder's lock, so concurrent exports are not harmed."""
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
                continue  # a running export's
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.info("removed %d scratch folder(s) of killed exports in %s: %s", len(removed), parent,
                 ", ".join(os.path.basename(p) for p in removed))
    return removed
