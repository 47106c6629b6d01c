"""Batches from DataLoader workers to the trainer through a shared-memory ring, not through the result pipe.

torch's DataLoader pickles what a worker yields into one pipe: a 640 KB text batch is copied five times and
crosses a 64 KB pipe in about ten write/read turns, each needing both processes scheduled, which on a busy
machine made four workers no faster than one (``benchmarks/loader.py``). Inside a worker, ``install`` registers
reducers with multiprocessing's ``ForkingPickler`` (the pickler of DataLoader's queues only, as torch does for
tensors; ``pickle.dumps`` and ``copy`` are unaffected) for ``pyarrow.RecordBatch`` and the given array-bundle
types: the batch's bytes are written once into the worker's own ring file (``/dev/shm``) and a small descriptor
goes through the pipe; the receiving process reads them with one ``preadv`` into a fresh buffer (so the trainer
owns its batch) and advances the ring's release mark. A batch too large for the ring, or a ring still full after
``_STALL_S``, goes to a new ring or through the pipe as before (below): a worker never blocks for good.

Zero copy on the trainer's side: the trainer maps each ring once and a batch it receives is a view of the ring
(arrow buffers, numpy arrays, tensors from ``to_torch``), not a copy: copying ~250 MB of text per epoch out of
the ring was most of the trainer's CPU per batch. A batch's region is released when the batch and every batch the
worker sent before it are garbage (a weakref on the region's memoryview, kept alive by every view of it), so the
worker writes there again only when nothing can read it. A trainer that keeps batches (``list(loader)``, a batch
kept for logging) fills the ring: after ``_STALL_S`` the worker leaves that ring to the views that pin it (its file
is unlinked at the worker's exit, like the others) and starts a new one, at most ``_MAX_RINGS`` times, then
sends through the pipe.

Items of one worker are unpickled in the order it sent them (one FIFO result queue), so one release mark per ring
suffices. A ring file is unlinked when its worker exits (the trainer's mapping outlives it while views remain); the
trainer unmaps it once no batch views it (when its last batch is collected, or at ``set_epoch``/``load_state_dict``,
which also give back the pages no kept batch uses), since a removed file's pages stay in /dev/shm while
mapped: fresh workers each epoch otherwise found the last epoch's rings still there, twice the memory. Fresh
workers are forked from the trainer and inherit its mappings: the saving needs ``set_epoch``/``load_state_dict``
before each epoch's ``iter(loader)`` (the README's loop), else a worker whose last batch was dropped before it
exited leaves its ring mapped, and the next epoch's workers hold it until they exit;
files of workers that died without exiting (SIGKILL) are removed by the next ring made on the machine. A worker
holds a shared ``flock`` on its ring file while it lives, and the sweep removes only files it can lock exclusively:
the kernel drops a dead process's lock whatever its PID namespace, whereas a PID in the name means nothing to a
job in another container sharing ``/dev/shm`` (``docker --ipc=host``, pods sharing an emptyDir), whose live rings
a PID check deleted. Rings left by datahub before that rule (``datahub-ring-*``, no flock) are removed only when
the kernel grants a write lease on them, i.e. no process anywhere has them open or mapped.
"""

from __future__ import annotations

import fcntl
import functools
import mmap
import os
import pickle
import re
import tempfile
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from multiprocessing import util as mp_util
from multiprocessing.reduction import ForkingPickler
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from datahub.loader.errors import WorkerBatchLostError
from datahub.loader.held_files import create_held, remove_if_unheld, unlink_quietly

_HEADER = 64  # the ring's first cache line: the reader's release mark (uint64, bytes of the stream released)
_CAPACITY = 16 << 20  # the largest ring of a worker; 25 text batches of 640 KB
_MAX_ITEM = _CAPACITY // 4
# A ring is sized for the item that makes it: _SLOTS such items (at least _MIN_CAPACITY, at most _CAPACITY), since
# every page of a ring is zeroed when made, faulted in by each side and freed at the worker's exit: about 1 ms of CPU
# per MiB and worker per epoch, measured here (DataLoader starts new workers every epoch). A worker's items in flight
# are DataLoader's prefetch_factor (default 2) plus the one or two the trainer holds: at most 4.1 items' bytes were
# in use at a reserve at the default, 8.1 at prefetch_factor=6 (benchmark release, 1 and 4 workers). 6 slots hold the
# default's items with room for a skipped tail at the wrap; with a larger prefetch_factor a reserve waits for the
# trainer to drop a batch (it does within a step: still one ring per worker at prefetch_factor=6 on the benchmark
# release, as with 8 slots), and only a ring found full for _STALL_S (a trainer that keeps batches, or steps that
# long) is replaced by one twice as big. 8 slots cost 10-20 ms more CPU per epoch with 4 workers (benchmark release:
# 6 MiB rings instead of 4)
_SLOTS = 6
_MIN_CAPACITY = 1 << 20
# capacities in steps of 64 KiB, not whole MiB: a token batch of 8 x 2048 (208 KB) got a 2 MiB ring for its 1.25 MB
# of slots, 0.75 MiB more per worker and epoch to zero, fault in on both sides and free (~1 ms per worker measured)
_GRAIN = 64 << 10
_STALL_S = 0.05  # a ring full for this long is held by batches the trainer keeps: start a new ring
_MAX_RINGS = 4  # rings one worker may make (each left one pins 16 MB while the trainer keeps its batches)
_ALIGN = 64
# not "datahub-ring-": datahub before the flock sweep judged "datahub-ring-<pid>-" files by their pid and would
# delete these rings of another PID namespace
_PREFIX = "datahub-shm-ring-"
# the names of those older rings (datahub-ring-<pid>-<uuid4 hex>): swept by a lease, since their workers hold no flock
_OLD_RING = re.compile(r"datahub-ring-[0-9]+-[0-9a-f]{32}")


class ArrayBundle(Protocol):
    """A type whose instances travel as named numpy arrays plus small picklable metadata."""

    def to_transfer(self) -> tuple[Any, dict[str, np.ndarray]]: ...

    @classmethod
    def from_transfer(cls, meta: Any, arrays: dict[str, np.ndarray]) -> Any: ...


def _ring_directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _sweep(directory: str) -> None:
    """Remove ring files no live process holds (their worker was killed before its exit handler ran): a live
    worker holds a shared flock on its ring, so an exclusive one is granted only on a dead worker's file. Rings
    named by datahub before that rule (``_OLD_RING``) are judged by a lease instead (``_sweep_old``)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        if not name.startswith(_PREFIX):
            if _OLD_RING.fullmatch(name):
                _sweep_old(path)
            continue
        remove_if_unheld(path, functools.partial(unlink_quietly, path))


def _sweep_old(path: str) -> None:
    """Remove an old-named ring if no process has it open or mapped. Its worker (datahub before the flock rule)
    takes no flock, so an exclusive flock would be granted on a live ring too; but that worker and its trainer keep
    the file mapped while they live, and the kernel grants a write lease (F_SETLEASE) only on a file that no
    process, in any PID namespace, has open or mapped. Refused, or leases unsupported here: the file is kept."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: never wait on another sweep's lease
    except OSError:  # gone meanwhile, or another user's file: not ours to judge
        return
    try:
        try:
            fcntl.fcntl(handle, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError:  # open or mapped by a live process (EAGAIN), or no leases on this filesystem
            return
        unlink_quietly(path)  # while the lease is held, an open of the path waits for its release
        fcntl.fcntl(handle, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    finally:
        os.close(handle)


def _close(path: str, handle: int) -> None:
    """At the worker's exit: remove its ring file, then drop its lock."""
    unlink_quietly(path)
    try:
        os.close(handle)
    except OSError:
        pass


class _Ring:
    """One worker's ring: ``reserve(size)`` gives (offset, end mark) of a free region, or None."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        directory = _ring_directory()
        _sweep(directory)
        self.path, handle = create_held(
            lambda: os.path.join(directory, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"), flags=os.O_RDWR)
        try:
            # reserve the pages now: a full /dev/shm (Docker's default is 64 MB) is then an error here, and the
            # worker uses the pipe, instead of a SIGBUS when the mapping is first written
            os.posix_fallocate(handle, 0, _HEADER + capacity)
            self.map = mmap.mmap(handle, _HEADER + capacity)
        except OSError:
            _close(self.path, handle)
            raise
        self.view = memoryview(self.map)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.released = np.frombuffer(self.map, dtype=np.uint64, count=1)
        self.written = 0  # bytes of the stream handed out, skipped tails at the wrap included
        self.pid = os.getpid()
        self.lock = threading.Lock()
        # the descriptor keeps the lock (a killed worker's is dropped by the kernel, so the next sweep removes it)
        mp_util.Finalize(self, _close, args=(self.path, handle), exitpriority=10)

    def fits(self, size: int) -> bool:
        """Whether items of ``size`` bytes go to this ring (a quarter of it; up to _MAX_ITEM in the largest ring)."""
        return size <= (_MAX_ITEM if self.capacity >= _CAPACITY else self.capacity // 4)

    def reserve(self, size: int) -> tuple[int, int] | None:
        if not self.fits(size):
            return None
        capacity = self.capacity
        position = self.written % capacity
        offset = 0 if size > capacity - position else position  # an item never wraps: skip the tail
        end = self.written + (capacity - position if offset == 0 and position else 0) + size
        deadline = 0.0
        while end - int(self.released[0]) > capacity:
            now = time.monotonic()
            if not deadline:
                deadline = now + _STALL_S
            elif now > deadline:
                return None
            time.sleep(0.0002)
        self.written = end
        return offset, end


_rings: dict[int, _Ring] = {}  # this process's ring (by pid: a forked child makes its own)
_made: dict[int, int] = {}  # rings each pid made
_outgrown: dict[int, int] = {}  # of those, rings each pid left because an item was too large for them
_retired: list[_Ring] = []  # rings left to the batches that pin them (unlinked at exit)
_failed: set[int] = set()  # pids that could not make a ring: they send through the pipe
_least: dict[int, int] = {}  # the smallest capacity each pid's next ring may have (doubled after a stall)


def _capacity_for(size: int, least: int = 0) -> int:
    """A ring's capacity for items of ``size`` bytes: _SLOTS of them, in _GRAIN steps, within the bounds above."""
    want = max(_SLOTS * size, min(_MIN_CAPACITY, _CAPACITY), least)
    return min(_CAPACITY, -(-want // _GRAIN) * _GRAIN)


def _ring(size: int) -> _Ring | None:
    """This process's ring, made (sized for items of ``size`` bytes) if it has none; None: use the pipe."""
    pid = os.getpid()
    ring = _rings.get(pid)
    if ring is None and pid not in _failed:
        try:
            ring = _rings[pid] = _Ring(_capacity_for(size, _least.get(pid, 0)))
            _made[pid] = _made.get(pid, 0) + 1
        except OSError:
            _failed.add(pid)
    return ring


def _reserve(size: int) -> tuple[_Ring, tuple[int, int]] | None:
    """A region for ``size`` bytes in this process's ring (a new ring when the trainer keeps the old one full, or
    the item is too large for it), or None: send through the pipe. Called by one thread at a time (the result
    queue's feeder thread)."""
    if size > _MAX_ITEM:
        return None
    ring = _ring(size)
    while ring is not None:
        if ring.fits(size):
            with ring.lock:
                slot = ring.reserve(size)
            if slot is not None:
                return ring, slot
            # full for _STALL_S: the trainer keeps batches that pin this ring (DataLoader has at most
            # prefetch_factor items in flight per worker): the next ring is twice as big
            _least[ring.pid] = 2 * ring.capacity
        else:  # outgrown, not kept full: the next ring holds _SLOTS of these items, over twice this one's capacity,
            # so this happens at most log2(_CAPACITY / _MIN_CAPACITY) times and does not count toward _MAX_RINGS
            _outgrown[ring.pid] = _outgrown.get(ring.pid, 0) + 1
        # leave the ring to the batches that pin it and start a new one, or, past _MAX_RINGS rings kept full, use the
        # pipe for the rest of this worker's life. The old file stays until the worker exits: descriptors still in
        # the pipe may name it before the trainer has mapped it
        _retired.append(_rings.pop(ring.pid))
        if _made.get(ring.pid, 0) - _outgrown.get(ring.pid, 0) >= _MAX_RINGS:
            _failed.add(ring.pid)
        ring = _ring(size)
    return None


class _Pending:
    """An item the trainer holds: its end mark in the worker's stream, its bytes' place in the ring (offset, size),
    and whether it is garbage yet. ``release`` is the callback of a weak reference to the object every view of the
    item keeps alive (a plain weakref: a ``weakref.finalize`` per item cost the trainer ~2 us each to make and to
    call, twice per token batch)."""

    __slots__ = ("view", "end", "offset", "size", "freed", "ref")

    def __init__(self, view: _RingView, end: int, offset: int, size: int) -> None:
        self.view, self.end, self.offset, self.size, self.freed = view, end, offset, size, False
        self.ref: weakref.ref[Any] | None = None

    def release(self, _gone: Any = None) -> None:
        self.view._free(self)


class _RingView:
    """The trainer's mapping of one worker's ring. ``region`` gives an item's bytes as a memoryview of the ring,
    ``array`` as a numpy array over them; once that object (kept alive by every view of the item) and every earlier
    item's are garbage, the ring's release mark moves past them.

    Each view holds 2 file descriptors while mapped (mmap's duplicate, and ``handle`` for the worker's flock), and
    every DataLoader worker forked meanwhile inherits them until it exits: 2 per worker as a rule (one ring each),
    at most 2 x (_MAX_RINGS + 4 rings outgrown, log2(_CAPACITY / _MIN_CAPACITY)) = 16 per worker while kept batches
    pin its rings. A finished worker's ring is closed once no batch views it (when its last batch is collected, or
    at the next ``set_epoch``/``load_state_dict`` or ring mapped), so a trainer that keeps batches of every epoch
    holds 2 per ring they pin."""

    def __init__(self, path: str) -> None:
        try:
            handle = os.open(path, os.O_RDWR)
        except OSError as error:
            raise WorkerBatchLostError(f"a DataLoader worker's batch is gone from its shared-memory ring {path} "
                                       f"({error}); was the worker killed, or the batch unpickled twice?") from error
        try:
            self.map = mmap.mmap(handle, os.fstat(handle).st_size)
        except BaseException:
            os.close(handle)
            raise
        # kept to ask whether the worker still holds its flock on the ring (``finished``), closed with the view. With
        # the duplicate Python's mmap keeps, a mapped ring costs 2 descriptors (see the class docstring)
        self.handle = handle
        weakref.finalize(self, os.close, handle)
        self.path = path
        self.view = memoryview(self.map)
        self.released = np.frombuffer(self.map, dtype=np.uint64, count=1)
        self.pending: deque[_Pending] = deque()  # per item in the worker's order
        self.lock = threading.RLock()  # a callback may run in the thread that holds it (a collection mid-call)

    def _check(self, offset: int, size: int) -> None:
        if _HEADER + offset + size > len(self.view):
            raise WorkerBatchLostError(f"shared-memory ring {self.path}: a batch at {offset}+{size} lies past its end")

    def _hold(self, item: Any, end: int, offset: int, size: int) -> None:
        """Release the item's bytes (in the worker's order) once ``item`` is garbage."""
        entry = _Pending(self, end, offset, size)
        entry.ref = weakref.ref(item, entry.release)  # the entry (in pending) keeps the weakref, so it fires
        with self.lock:
            self.pending.append(entry)

    def region(self, offset: int, size: int, end: int) -> memoryview:
        self._check(offset, size)
        window = self.view[_HEADER + offset : _HEADER + offset + size]
        self._hold(window, end, offset, size)  # fires when the last view of the item is gone
        return window

    def array(self, offset: int, size: int, end: int) -> np.ndarray:
        """The item's bytes as one uint8 array; arrays made on it (``np.ndarray(..., buffer=it)``) keep it alive
        (numpy stops collapsing a view's base at it: its own base is a memoryview, not an array)."""
        self._check(offset, size)
        base = np.frombuffer(self.map, dtype=np.uint8, count=size, offset=_HEADER + offset)
        self._hold(base, end, offset, size)
        return base

    def _free(self, entry: _Pending) -> None:
        with self.lock:
            entry.freed = True
            mark = None
            while self.pending and self.pending[0].freed:
                mark = self.pending.popleft().end
            if mark is not None:
                self.released[0] = mark
            idle = not self.pending
        # its last batch gone after its worker exited: unmap it now, not when a later epoch's worker sends its first
        # batch (a weakref callback: it never waits for the table's lock)
        if idle and not os.path.exists(self.path) and self.finished():
            release_finished_rings(wait=False)

    def idle(self) -> bool:
        with self.lock:
            return not self.pending

    def finished(self) -> bool:
        """Whether the ring's worker exited: it holds a shared flock on its ring while it lives (a file removed
        from /dev/shm by someone else while the worker writes to it is not finished)."""
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        return True

    def free_unused(self) -> None:
        """Give the pages no batch views back to /dev/shm (``MADV_REMOVE``), for a ring whose worker exited (nothing
        writes it again) while the trainer keeps batches of it: every page outside the bytes of the items not yet
        garbage (each entry's offset and size), the gaps between kept batches too; page 0 (the header) is kept."""
        with self.lock:
            if not self.pending:
                return
            capacity = len(self.view) - _HEADER
            live = sorted((entry.offset, entry.offset + entry.size) for entry in self.pending if not entry.freed)
            free, at = [], 0
            for low, high in live:  # an item never wraps (``_Ring.reserve``)
                if low > at:
                    free.append((at, low))
                at = max(at, high)
            free.append((at, capacity))
            page = mmap.PAGESIZE
            for low, high in free:  # whole pages inside a free range only: low rounded up, high down
                low = max(page, -(-(_HEADER + low) // page) * page)
                high = (_HEADER + high) // page * page
                if high > low:
                    try:
                        self.map.madvise(mmap.MADV_REMOVE, low, high - low)
                    except (OSError, ValueError, AttributeError):  # no hole punching on this filesystem or platform
                        return


_views: dict[str, _RingView] = {}  # the trainer's mappings, by ring path
# several trainer threads unpickle batches (the main thread, each DataLoader's pin_memory thread): one's cleanup
# below must not iterate _views while another inserts
_views_lock = threading.Lock()


def _view(path: str) -> _RingView:
    """The trainer's mapping of the ring at ``path`` (mapped at its first item)."""
    with _views_lock:
        view = _views.get(path)
        if view is None:
            _forget_finished()
            view = _views[path] = _RingView(path)
    return view


def _forget_finished(*, free_unused: bool = False) -> None:
    """Under ``_views_lock``: drop the mappings of rings whose worker exited (file removed, its flock free) and that
    no batch views (unmapped when collected; a removed file's pages stay in /dev/shm while it is mapped); with
    ``free_unused``, give back the unused pages of those a kept batch still views."""
    for old in [v for v in _views.values() if not os.path.exists(v.path) and v.finished()]:
        if old.idle():
            del _views[old.path]
        elif free_unused:
            old.free_unused()


def release_finished_rings(*, wait: bool = True) -> None:
    """In the trainer: unmap the rings of DataLoader workers that exited, and give back what a batch the trainer
    keeps does not use of its ring. Fresh workers (``persistent_workers=False``) make new rings every epoch and
    remove the old files at exit, but the pages of a removed file stay in /dev/shm while the trainer maps it:
    without this, the last epoch's rings were held until the next epoch's first batch, after its workers had made
    theirs (twice the memory, and a small /dev/shm full: the pipe). Called by ``set_epoch``/``load_state_dict``
    and when a finished ring's last batch is garbage; ``wait=False`` gives up if another thread holds the table."""
    if not _views_lock.acquire(blocking=wait):
        return
    try:
        _forget_finished(free_unused=wait)
    finally:
        _views_lock.release()


def _region(path: str, offset: int, size: int, end: int) -> memoryview:
    """The item's bytes in the ring at ``path``, viewed in place (see ``_RingView``): every view of them (numpy
    arrays, pyarrow buffers) keeps this memoryview alive."""
    view = _views.get(path)  # a dict read is atomic; a miss maps it under the lock
    return (view if view is not None else _view(path)).region(offset, size, end)


def _rebuilt(rebuild: Callable[..., Any], *args: Any) -> Any:
    """``rebuild(*args)``, or the error it raised as torch's ``ExceptionWrapper``, the DataLoader's own form of a
    failed item, which it re-raises in the trainer with the message and traceback. A batch is unpickled where the
    DataLoader reads its result queue: with ``pin_memory=True`` that is torch's pin thread, where an exception ends
    the thread and the trainer only saw "Pin memory thread exited unexpectedly", not this error."""
    try:
        return rebuild(*args)
    except Exception:  # noqa: BLE001 - handed to the trainer whole, never swallowed
        from torch._utils import ExceptionWrapper  # loaded: only a DataLoader reads these descriptors

        return ExceptionWrapper(where="in the trainer, reading a DataLoader worker's batch from shared memory")


# --- pyarrow RecordBatch: its IPC stream in the ring ----------------------------------------------------------


def _record_batch_from_ring(path: str, offset: int, size: int, end: int) -> pa.RecordBatch:
    return pa.ipc.open_stream(pa.py_buffer(_region(path, offset, size, end))).read_next_batch()  # views of the ring


def _reduce_record_batch(batch: pa.RecordBatch) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    size = batch.schema.serialize().size + pa.ipc.get_record_batch_size(batch) + 64  # + stream framing
    reserved = _reserve(size)
    if reserved is not None:
        ring, (offset, end) = reserved
        sink = pa.FixedSizeBufferWriter(pa.py_buffer(ring.view[_HEADER + offset : _HEADER + offset + size]))
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return _rebuilt, (_record_batch_from_ring, ring.path, offset, sink.tell(), end)
    return batch.__reduce__()  # type: ignore[no-any-return]


# --- array bundles (e.g. packed token batches) -----------------------------------------------------------------


Layout = tuple[tuple[str, str, tuple[int, ...], int], ...]  # per array: name, dtype, shape, offset in the region
# the trainer's parsed layouts, by the pickled layout the descriptor carries (one bytes object to unpickle and hash
# per item instead of a tuple of tuples): per array its name, dtype, shape and offset
_layouts: dict[bytes, list[tuple[str, np.dtype[Any], tuple[int, ...], int]]] = {}
_layout_keys: dict[Layout, bytes] = {}  # in a worker: each layout's pickled form


def _parsed(key: bytes) -> list[tuple[str, np.dtype[Any], tuple[int, ...], int]]:
    """The layout pickled in ``key`` with its dtypes made, once per distinct layout (a worker sends the same few)."""
    parsed = _layouts.get(key)
    if parsed is None:
        if len(_layouts) >= 256:
            _layouts.clear()
        layout: Layout = pickle.loads(key)
        parsed = _layouts[key] = [(name, np.dtype(dtype), shape, at) for name, dtype, shape, at in layout]
    return parsed


def _layout_key(layout: Layout) -> bytes:
    key = _layout_keys.get(layout)
    if key is None:
        if len(_layout_keys) >= 256:
            _layout_keys.clear()
        key = _layout_keys[layout] = pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL)
    return key


def _bundle_from_ring(kind: type[ArrayBundle], meta: Any, layout: bytes, path: str, offset: int, size: int,
                      end: int) -> Any:
    """The bundle's arrays as views of the ring (one base array per item, which each of them keeps alive), or the
    error as torch's ``ExceptionWrapper`` (see ``_rebuilt``; inlined: this runs once per batch in the trainer)."""
    try:
        view = _views.get(path)
        base = (view if view is not None else _view(path)).array(offset, size, end)
        return kind.from_transfer(meta, {name: np.ndarray(shape, dtype, base, at)
                                         for name, dtype, shape, at in _parsed(layout)})
    except Exception:  # noqa: BLE001 - handed to the trainer whole, never swallowed
        from torch._utils import ExceptionWrapper

        return ExceptionWrapper(where="in the trainer, reading a DataLoader worker's batch from shared memory")


def _bundle_inline(kind: type[ArrayBundle], meta: Any, arrays: dict[str, np.ndarray]) -> Any:
    return kind.from_transfer(meta, arrays)


def _reduce_bundle(item: ArrayBundle) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    meta, arrays = item.to_transfer()
    if os.getpid() not in _failed:
        places, size = [], 0
        for name, array in arrays.items():
            array = np.ascontiguousarray(array)
            arrays[name] = array
            places.append((name, array.dtype.str, tuple(array.shape), size))
            size += max(_ALIGN, -(-array.nbytes // _ALIGN) * _ALIGN)
        layout = tuple(places)
        reserved = _reserve(size)
        if reserved is not None:
            ring, (offset, end) = reserved
            base = _HEADER + offset
            for (name, _, _, at) in layout:
                flat = arrays[name].reshape(-1).view(np.uint8)
                ring.bytes[base + at : base + at + flat.nbytes] = flat
            return _bundle_from_ring, (type(item), meta, _layout_key(layout), ring.path, offset, size, end)
    return _bundle_inline, (type(item), meta, arrays)


_installed: set[type] = set()


def install(bundle_types: tuple[type[ArrayBundle], ...] = ()) -> None:
    """In a DataLoader worker: send pyarrow RecordBatches and ``bundle_types`` through this process's ring."""
    for kind, reducer in ((pa.RecordBatch, _reduce_record_batch),
                          *((bundle, _reduce_bundle) for bundle in bundle_types)):
        if kind not in _installed:
            ForkingPickler.register(kind, reducer)
            _installed.add(kind)
