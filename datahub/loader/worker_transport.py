"""Batches from DataLoader workers to the trainer through a shared-memory ring, not through the result pipe.

torch's DataLoader pickles what a worker yields into one pipe: a 640 KB text batch is copied five times and
crosses a 64 KB pipe in about ten write/read turns, each needing both processes scheduled, which on a busy
machine made four workers no faster than one (``benchmarks/loader.py``). Inside a worker, ``install`` registers
reducers with multiprocessing's ``ForkingPickler`` (the pickler of DataLoader's queues only, as torch does for
tensors; ``pickle.dumps`` and ``copy`` are unaffected) for ``pyarrow.RecordBatch`` and the given array-bundle
types: the batch's bytes are written once into the worker's own ring file (``/dev/shm``) and a small descriptor
goes through the pipe; the receiving process reads them with one ``preadv`` into a fresh buffer (so the trainer
owns its batch) and advances the ring's release mark. A batch too large for the ring, or a ring still full after
``_WAIT_S`` (a trainer that stopped reading), goes through the pipe as before: a worker never blocks for good.

Items of one worker are unpickled in the order it sent them (one FIFO result queue), so one release mark per ring
suffices. A ring file is unlinked when its worker exits; files of workers that died without exiting (SIGKILL) are
removed by the next ring made on the machine (their pid is in the name).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from multiprocessing import util as mp_util
from multiprocessing.reduction import ForkingPickler
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from datahub.loader.errors import WorkerBatchLostError

_HEADER = 64  # the ring's first cache line: the reader's release mark (uint64, bytes of the stream released)
_CAPACITY = 16 << 20  # per worker; 25 text batches of 640 KB
_MAX_ITEM = _CAPACITY // 4
_WAIT_S = 2.0  # a ring full for this long: send through the pipe instead
_ALIGN = 64
_PREFIX = "datahub-ring-"
_MARK = struct.Struct("<Q")


class ArrayBundle(Protocol):
    """A type whose instances travel as named numpy arrays plus small picklable metadata."""

    def to_transfer(self) -> tuple[Any, dict[str, np.ndarray]]: ...

    @classmethod
    def from_transfer(cls, meta: Any, arrays: dict[str, np.ndarray]) -> Any: ...


def _ring_directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _sweep(directory: str) -> None:
    """Remove ring files whose worker process no longer exists (killed before its exit handler ran)."""
    try:
        names = [name for name in os.listdir(directory) if name.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        except OSError:  # another user's process: not ours to judge
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _Ring:
    """One worker's ring: ``reserve(size)`` gives (offset, end mark) of a free region, or None."""

    def __init__(self) -> None:
        directory = _ring_directory()
        _sweep(directory)
        self.path = os.path.join(directory, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")
        handle = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            # reserve the pages now: a full /dev/shm (Docker's default is 64 MB) is then an error here, and the
            # worker uses the pipe, instead of a SIGBUS when the mapping is first written
            os.posix_fallocate(handle, 0, _HEADER + _CAPACITY)
            self.map = mmap.mmap(handle, _HEADER + _CAPACITY)
        except OSError:
            _unlink(self.path)
            raise
        finally:
            os.close(handle)
        self.view = memoryview(self.map)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.released = np.frombuffer(self.map, dtype=np.uint64, count=1)
        self.written = 0  # bytes of the stream handed out, skipped tails at the wrap included
        self.pid = os.getpid()
        self.lock = threading.Lock()
        mp_util.Finalize(self, _unlink, args=(self.path,), exitpriority=10)

    def reserve(self, size: int) -> tuple[int, int] | None:
        if size > _MAX_ITEM:
            return None
        position = self.written % _CAPACITY
        offset = 0 if size > _CAPACITY - position else position  # an item never wraps: skip the tail
        end = self.written + (_CAPACITY - position if offset == 0 and position else 0) + size
        deadline = 0.0
        while end - int(self.released[0]) > _CAPACITY:
            now = time.monotonic()
            if not deadline:
                deadline = now + _WAIT_S
            elif now > deadline:
                return None
            time.sleep(0.0002)
        self.written = end
        return offset, end


_rings: dict[int, _Ring] = {}  # this process's ring (by pid: a forked child makes its own)
_failed: set[int] = set()  # pids that could not make a ring: they send through the pipe


def _ring() -> _Ring | None:
    pid = os.getpid()
    ring = _rings.get(pid)
    if ring is None and pid not in _failed:
        try:
            ring = _rings[pid] = _Ring()
        except OSError:
            _failed.add(pid)
    return ring


def _read(path: str, offset: int, size: int, end: int) -> np.ndarray:
    """The item's bytes from the ring at ``path`` into a new buffer; then release the ring up to ``end``."""
    out = np.empty(size, dtype=np.uint8)
    try:
        handle = os.open(path, os.O_RDWR)
    except OSError as error:
        raise WorkerBatchLostError(f"a DataLoader worker's batch is gone from its shared-memory ring {path} ({error}); "
                          "was the worker killed, or the batch unpickled twice?") from error
    try:
        got = os.preadv(handle, [out.data], _HEADER + offset)
        os.pwrite(handle, _MARK.pack(end), 0)
    finally:
        os.close(handle)
    if got != size:
        raise WorkerBatchLostError(f"shared-memory ring {path}: read {got} of {size} bytes of a batch")
    return out


# --- pyarrow RecordBatch: its IPC stream in the ring ----------------------------------------------------------


def _record_batch_from_ring(path: str, offset: int, size: int, end: int) -> pa.RecordBatch:
    data = _read(path, offset, size, end)
    return pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()  # zero-copy views of ``data``


def _reduce_record_batch(batch: pa.RecordBatch) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    ring = _ring()
    if ring is not None:
        size = batch.schema.serialize().size + pa.ipc.get_record_batch_size(batch) + 64  # + stream framing
        with ring.lock:
            slot = ring.reserve(size)
            if slot is not None:
                offset, end = slot
                sink = pa.FixedSizeBufferWriter(pa.py_buffer(ring.view[_HEADER + offset : _HEADER + offset + size]))
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_batch(batch)
                return _record_batch_from_ring, (ring.path, offset, sink.tell(), end)
    return batch.__reduce__()  # type: ignore[no-any-return]


# --- array bundles (e.g. packed token batches) -----------------------------------------------------------------


def _bundle_from_ring(kind: type[ArrayBundle], meta: Any, layout: list[tuple[str, str, tuple[int, ...], int]],
                      path: str, offset: int, size: int, end: int) -> Any:
    data = _read(path, offset, size, end)
    arrays = {}
    for name, dtype, shape, at in layout:
        count = math.prod(shape)
        arrays[name] = np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=at).reshape(shape)
    return kind.from_transfer(meta, arrays)


def _bundle_inline(kind: type[ArrayBundle], meta: Any, arrays: dict[str, np.ndarray]) -> Any:
    return kind.from_transfer(meta, arrays)


def _reduce_bundle(item: ArrayBundle) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    meta, arrays = item.to_transfer()
    ring = _ring()
    if ring is not None:
        layout, size = [], 0
        for name, array in arrays.items():
            array = np.ascontiguousarray(array)
            arrays[name] = array
            layout.append((name, array.dtype.str, tuple(array.shape), size))
            size += -(-array.nbytes // _ALIGN) * _ALIGN
        with ring.lock:
            slot = ring.reserve(size)
            if slot is not None:
                offset, end = slot
                base = _HEADER + offset
                for (name, _, _, at) in layout:
                    flat = arrays[name].reshape(-1).view(np.uint8)
                    ring.bytes[base + at : base + at + flat.nbytes] = flat
                return _bundle_from_ring, (type(item), meta, layout, ring.path, offset, size, end)
    return _bundle_inline, (type(item), meta, arrays)


_installed: set[type] = set()


def install(bundle_types: tuple[type[ArrayBundle], ...] = ()) -> None:
    """In a DataLoader worker: send pyarrow RecordBatches and ``bundle_types`` through this process's ring."""
    for kind, reducer in ((pa.RecordBatch, _reduce_record_batch),
                          *((bundle, _reduce_bundle) for bundle in bundle_types)):
        if kind not in _installed:
            ForkingPickler.register(kind, reducer)
            _installed.add(kind)
