"""Whether DataLoader worker processes iterate a dataset, as seen from the process that owns it, and the owner's
position (epoch, resume point) for persistent workers (``TrainerPosition``).

A plain torch DataLoader with workers gives each worker a copy of the dataset (fork or pickle), so the
owner's copy never yields anything and its count of consumed samples stays 0. Workers create a marker file
whose (random, private) path the copies share; the owner checks for it. A file rather than shared memory,
because a path survives both fork and pickling (``multiprocessing_context="spawn"``). The marker names the number of
workers and the owner's position generation they read, and live workers hold a shared flock on it, so that the owner
iterating the dataset itself beside them (a look at a sample) does not take the trainer's count for its own.

Both files belong to one dataset object. A DataLoader worker's copy must share them (a forked copy does; a spawned
worker's copy is pickled by multiprocessing's ``ForkingPickler``, whose reducers below keep the path), but any other
copy is another dataset (``copy.deepcopy``, ``pickle``, ``copy.copy`` through ``OwnPosition``): it gets its own
files, or the two datasets' ``set_epoch``/``load_state_dict`` moved each other's persistent workers, and one read in
this process made the other's ``state_dict()`` claim nothing was consumed.

A process that owns datasets holds a shared flock on its owner file (``datahub-loader-owner-<token>``) while it
lives, and its datasets' files carry its token. A dataset's files go with it (a finalizer), but a SIGKILLed trainer
runs none: its files stayed for good. The first dataset a process makes sweeps them: a token whose owner file it
can lock exclusively has no live owner (the kernel drops a dead process's lock whatever its PID namespace, so a job
in another container sharing /tmp keeps its files), and that token's files go, then its owner file. Files without
an owner file (named by datahub before this rule, whose owner held nothing) are never judged: removing a live
trainer's would silently change what it resumes from.
"""

from __future__ import annotations

import copy
import fcntl
import functools
import os
import pickle
import re
import tempfile
import threading
import uuid
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

from datahub.loader.held_files import create_held, remove_if_unheld, unlink_quietly


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked worker's copy must not delete the marker its parent reads
        try:
            os.unlink(path)
        except OSError:
            pass


_held: dict[str, tuple[int, int]] = {}  # in a worker: marker path -> (descriptor, inode) holding a shared flock

_OWNER = "datahub-loader-owner-"
_OWNER_NAME = re.compile(r"datahub-loader-owner-([0-9a-f]{32})")
# a dataset's files: datahub-loader-<kind>-<owner token>-<own hex>, and a position being written (.partial)
_OWNED_NAME = re.compile(r"datahub-loader-(?:workers|position)-([0-9a-f]{32})-[0-9a-f]{32}(?:-[0-9]+\.partial)?")


class _Owner:
    """This process's shared flock on its owner file, held while it lives (see the module docstring)."""

    def __init__(self, directory: str) -> None:
        self.pid = os.getpid()
        path, handle = create_held(lambda: os.path.join(directory, _OWNER + uuid.uuid4().hex))
        self.token = os.path.basename(path)[len(_OWNER):]
        self.handle = handle
        # at exit the datasets' finalizers (made later) run first: the owner file goes after their files
        self.finalizer = weakref.finalize(self, _release_owner, path, handle, self.pid)

    def forget(self) -> None:
        """In a forked child: drop its copy of the descriptor, so the lock lives exactly as long as the owner (a
        DataLoader worker outliving a killed trainer for seconds does not keep its files from the sweep)."""
        self.finalizer.detach()
        try:
            os.close(self.handle)
        except OSError:
            pass


_owner: _Owner | None = None
_owner_made = threading.Lock()


def _owner_token() -> str:
    """This process's token for its datasets' file names; the first call makes the owner file and sweeps."""
    global _owner
    with _owner_made:
        if _owner is None:
            directory = tempfile.gettempdir()
            try:
                _owner = _Owner(directory)
            except OSError:  # no owner file: this dataset's files are never swept (no temp dir: no files either)
                return uuid.uuid4().hex
            _sweep(directory, keep=_owner.token)
        return _owner.token


def _forget_owner_in_child() -> None:
    global _owner, _owner_made
    _owner_made = threading.Lock()  # another thread may have held it at the fork
    if _owner is not None:
        _owner.forget()
        _owner = None


os.register_at_fork(after_in_child=_forget_owner_in_child)


def _release_owner(path: str, handle: int, pid: int) -> None:
    if os.getpid() == pid:
        unlink_quietly(path)
        try:
            os.close(handle)
        except OSError:
            pass


def _sweep(directory: str, *, keep: str) -> None:
    """Remove the files of owners that are gone: an owner file this process can lock exclusively (no process, in
    any PID namespace, holds its shared lock), that token's dataset files, then the owner file itself."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    owners: list[str] = []
    owned: dict[str, list[str]] = {}
    for name in names:
        match = _OWNED_NAME.fullmatch(name)
        if match is not None:
            owned.setdefault(match.group(1), []).append(name)
            continue
        match = _OWNER_NAME.fullmatch(name)
        if match is not None and match.group(1) != keep:
            owners.append(match.group(1))
    for token in owners:
        remove_if_unheld(os.path.join(directory, _OWNER + token),
                         functools.partial(_remove_owned, directory, token, owned.get(token, [])))


def _remove_owned(directory: str, token: str, names: list[str]) -> None:
    for name in names:
        unlink_quietly(os.path.join(directory, name))
    # last: a file of a token without an owner file is never judged
    unlink_quietly(os.path.join(directory, _OWNER + token))


def _owned_path(kind: str) -> str:
    """A new private path for one of this process's datasets' files (``kind``: workers, position)."""
    return os.path.join(tempfile.gettempdir(), f"datahub-loader-{kind}-{_owner_token()}-{uuid.uuid4().hex}")


class WorkerUse:
    """``mark(num_workers, generation)`` in a worker, ``seen()``/``workers()`` in the owner, ``iterated_here`` when the
    owner iterates itself. The file holds the number of workers, which the owner's state_dict needs to know how the
    trainer's items were split, and the owner's ``TrainerPosition`` generation they read (the position set by the
    last ``set_epoch``/``load_state_dict``)."""

    def __init__(self) -> None:
        self.path = _owned_path("workers")
        weakref.finalize(self, _remove, self.path, os.getpid())

    def __reduce__(self) -> tuple[Any, ...]:  # pickle, copy and deepcopy: another dataset's marker, same content
        return _copied_worker_use, (self._read(),)

    def mark(self, num_workers: int = 1, generation: int = 0) -> None:
        text = f"{num_workers} {generation}"
        if self._read() != text:
            self._write(text)
        self._hold()

    def _hold(self) -> None:
        """In a worker: keep a shared flock on the marker while this process lives (the kernel drops it when the
        worker exits or is killed), so the owner can tell that workers reading it are alive (``iterated_here``)."""
        try:
            inode = os.stat(self.path).st_ino
        except OSError:
            return
        held = _held.get(self.path)
        if held is not None and held[1] == inode:
            return
        try:
            handle = os.open(self.path, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_SH)
        except OSError:
            os.close(handle)
            return
        if held is not None:
            os.close(held[0])
        _held[self.path] = (handle, os.fstat(handle).st_ino)

    def _workers_alive(self) -> bool:
        """In the owner: whether a live DataLoader worker holds the marker (see ``_hold``)."""
        try:
            handle = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(handle)  # drops the lock taken here, if any
        return False

    def _write(self, text: str) -> None:
        try:
            handle = os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                os.write(handle, text.encode())
            finally:
                os.close(handle)
        except OSError:  # no writable temp dir: the owner then cannot refuse, as before this check existed
            pass

    def _read(self) -> str | None:
        try:
            with open(self.path, "rb") as handle:
                return handle.read().strip().decode()
        except (OSError, UnicodeDecodeError):
            return None

    def seen(self) -> bool:
        return os.path.exists(self.path)

    def workers(self) -> int | None:
        """The number of DataLoader workers that last iterated the dataset, or None (never, or iterated here since)."""
        text = self._read()
        if text is None:
            return None
        first = text.split()[0] if text else ""
        return int(first) if first.isdigit() else 1

    def iterated_here(self, generation: int) -> None:
        """The owner iterates the dataset itself: from now on its own count is the trainer's (the marker goes), unless
        live DataLoader workers read the same position (marked with this ``generation``: no set_epoch/load_state_dict
        since). That is a look beside them (``next(iter(dataset))`` to log a sample), and ``state_dict(consumed=N)``
        still counts the DataLoader's batches, split over its workers: clearing the marker made it count N items of
        one stream, a resume that repeated some samples and skipped others."""
        parts = (self._read() or "").split()
        if len(parts) == 2 and parts[1] == str(generation) and self._workers_alive():
            return
        self.clear()

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:  # not there (the usual case)
            pass


class TrainerPosition:
    """The owner's ``set_epoch``/``load_state_dict`` for its persistent DataLoader workers.

    A worker's copy of the dataset is made once when ``persistent_workers=True``: without this, each epoch the
    worker repeated the position it was copied with (the first epoch's order; after a resume, that epoch's tail).
    The owner writes the position attributes those calls set, with a generation number, to a private file
    (``publish``); a worker's copy takes them at each ``__iter__`` when newer than its own (``take``), so it starts
    where a fresh copy would. A copy made after the last ``publish`` has that generation already and takes nothing.
    """

    def __init__(self) -> None:
        self.path = _owned_path("position")
        self.generation = 0
        weakref.finalize(self, _remove, self.path, os.getpid())

    def __reduce__(self) -> tuple[Any, ...]:  # pickle, copy and deepcopy: another dataset's position, same generation
        return _copied_position, (self.generation,)

    def publish(self, fields: dict[str, Any]) -> None:
        """In the owner: ``fields`` (attribute name to value) are the position its workers' next iteration uses."""
        self.generation += 1
        partial = f"{self.path}-{os.getpid()}.partial"
        try:
            with open(partial, "wb") as handle:
                pickle.dump((self.generation, fields), handle, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial, self.path)  # a worker reads the old or the new position, never half of one
        except OSError as error:
            _remove(partial, os.getpid())
            raise OSError(f"cannot write the dataset position for persistent DataLoader workers to {self.path} "
                          f"({error}); free space in {tempfile.gettempdir()} (TMPDIR)") from error

    def _read(self) -> tuple[int, dict[str, Any]] | None:
        try:
            with open(self.path, "rb") as handle:
                generation, fields = pickle.load(handle)  # our own private file (0600 in the user's temp dir)
        except FileNotFoundError:
            return None
        return int(generation), fields

    def take(self) -> dict[str, Any] | None:
        """In a worker: the owner's position if published after this copy's, else None."""
        read = self._read()
        if read is None or read[0] <= self.generation:
            return None
        self.generation = read[0]
        return read[1]

    # in a worker whose copy loaded a StatefulDataLoader state: the position it had before (the owner's), which the
    # pass after the one the state was for goes back to, as a fresh worker's copy of the owner would
    restore: dict[str, Any] | None = None
    armed = False  # the loaded state served a pass: the next one restores

    def before_worker_load(self, fields: dict[str, Any]) -> None:
        """In a worker, before a StatefulDataLoader state is loaded into its copy: ``fields`` is its position now."""
        if self.restore is None:
            self.restore, self.armed = fields, False

    def next_pass(self) -> dict[str, Any] | None:
        """In a worker at each ``__iter__``: the position to take, or None (keep its own). The owner's newer position
        first; else, once a loaded StatefulDataLoader state served one pass, the position from before it."""
        fields = self.take()
        if fields is not None:
            self.restore, self.armed = None, False
            return fields
        if self.restore is not None and self.armed:
            fields, self.restore, self.armed = self.restore, None, False
            return fields
        self.armed = self.restore is not None
        return None

    def catch_up(self) -> None:
        """In a worker that loads its own state (torchdata's StatefulDataLoader): what the owner published so far
        is older than that state, so ``take`` skips it."""
        read = self._read()
        if read is not None:
            self.generation = max(self.generation, read[0])


def _copied_worker_use(text: str | None) -> WorkerUse:
    """A copy's own marker, saying what the original's said when copied (a copy is a snapshot of its state)."""
    use = WorkerUse()
    if text is not None:
        use._write(text)
    return use


def _copied_position(generation: int) -> TrainerPosition:
    """A copy's own position file (none written yet), at the original's generation (its markers' reference)."""
    position = TrainerPosition()
    position.generation = generation
    return position


def _worker_use_of(path: str) -> WorkerUse:
    """The owner's ``WorkerUse`` in a spawned DataLoader worker (no finalizer: the owner removes the file)."""
    use = WorkerUse.__new__(WorkerUse)
    use.path = path
    return use


def _position_of(path: str, generation: int) -> TrainerPosition:
    """The owner's ``TrainerPosition`` in a spawned DataLoader worker, at the generation it was copied with."""
    position = TrainerPosition.__new__(TrainerPosition)
    position.path, position.generation = path, generation
    return position


# only multiprocessing's pickler (a spawned or forkserver DataLoader worker receiving the dataset) keeps the files
ForkingPickler.register(WorkerUse, lambda use: (_worker_use_of, (use.path,)))
ForkingPickler.register(TrainerPosition, lambda position: (_position_of, (position.path, position.generation)))


class OwnPosition:
    """Mixin of the datasets holding ``_worker_use`` and ``_position``: ``copy.copy`` gives the copy its own files
    (``copy.deepcopy`` and ``pickle`` do through the classes' reducers)."""

    _worker_use: WorkerUse
    _position: TrainerPosition

    def __copy__(self) -> Any:
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._worker_use, twin._position = copy.copy(self._worker_use), copy.copy(self._position)
        return twin
