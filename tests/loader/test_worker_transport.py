"""Batches from DataLoader workers through the shared-memory ring: equal to in-process reads, ring wrap and
full-ring fallback, no ring file left behind, stale rings of killed workers removed (and live ones of other PID
namespaces kept), a lost batch named."""

from __future__ import annotations

import functools
import mmap
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from datahub.loader import PackedDataset, ReleaseDataset, worker_transport  # noqa: E402
from datahub.loader.errors import WorkerBatchLostError  # noqa: E402
from datahub.loader.held_files import unlink_quietly  # noqa: E402
from tests.loader.shards import write_release  # noqa: E402
from tests.loader.tokens import write_tokens  # noqa: E402


def rings() -> set[str]:
    directory = worker_transport._ring_directory()
    return {name for name in os.listdir(directory) if name.startswith(worker_transport._PREFIX)}


def alive(pid: int) -> bool:  # rings of live processes may be another program's (tests run beside benchmarks)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def text_release(tmp_path: Path) -> str:
    write_release(tmp_path / "export", samples_per_shard=(30, 25, 41, 30, 33, 28), text_bytes=700)
    return str(tmp_path / "export" / "manifest.json")


def arrow_batches(path: str, workers: int, **kwargs: Any) -> list[pa.RecordBatch]:
    dataset = ReleaseDataset(path, rank=0, world_size=1, seed=3, shuffle_buffer=40, batch_size=16,
                             batch_format="arrow", **kwargs)
    return list(DataLoader(dataset, batch_size=None, num_workers=workers)) if workers else list(dataset)


def by_id(batches: list[pa.RecordBatch]) -> dict[str, tuple[str, bool]]:
    table = pa.Table.from_batches(batches)
    ids, texts, padding = (table.column(name).to_pylist() for name in ("sample_id", "text", "is_padding"))
    assert len(set(ids)) == len(ids), "each sample once"
    return {i: (t, p) for i, t, p in zip(ids, texts, padding)}


@pytest.mark.parametrize("capacity", [worker_transport._CAPACITY, 64 << 10])
def test_arrow_batches_from_workers_equal_in_process_batches(text_release: str, capacity: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 KB: every batch (~11 KB of text) wraps the ring several times over the epoch
    monkeypatch.setattr(worker_transport, "_CAPACITY", capacity)
    monkeypatch.setattr(worker_transport, "_MAX_ITEM", capacity // 4)
    before = rings()
    local = arrow_batches(text_release, 0)
    remote = arrow_batches(text_release, 3)
    assert all(isinstance(batch, pa.RecordBatch) for batch in remote)
    # each worker's piece of the stream ends with its own short batch, so compare samples, not batch bounds
    assert by_id(remote) == by_id(local)
    left = [name for name in rings() - before if not alive(int(name[len(worker_transport._PREFIX):].split("-")[0]))]
    assert not left, f"the workers' ring files are gone once the DataLoader is done: {left}"


def test_full_ring_and_oversized_batches_go_through_the_pipe(text_release: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # a ring that holds one batch and a trainer that keeps every batch (list): each worker starts new rings, then
    # falls back to the pipe; batches over _MAX_ITEM never try the ring
    monkeypatch.setattr(worker_transport, "_CAPACITY", 16 << 10)
    monkeypatch.setattr(worker_transport, "_MAX_ITEM", 16 << 10)
    monkeypatch.setattr(worker_transport, "_STALL_S", 0.02)
    before = rings()
    local = arrow_batches(text_release, 0)
    assert by_id(arrow_batches(text_release, 2)) == by_id(local)
    left = [name for name in rings() - before if not alive(int(name[len(worker_transport._PREFIX):].split("-")[0]))]
    assert not left, f"the rings a worker left to kept batches are gone once it exits: {left}"
    monkeypatch.setattr(worker_transport, "_MAX_ITEM", 1 << 10)
    assert by_id(arrow_batches(text_release, 2)) == by_id(local)


def test_token_batches_from_workers_equal_in_process_batches(tmp_path: Path) -> None:
    prefixes, _ = write_tokens(tmp_path / "tok", files=4, documents=60, max_len=50)

    def batches(workers: int) -> list[Any]:
        dataset = PackedDataset(prefixes, seq_len=64, batch_size=4, rank=0, world_size=1, seed=2, shuffle_buffer=20)
        return list(DataLoader(dataset, batch_size=None, num_workers=workers)) if workers else list(dataset)

    local, remote = batches(0), batches(3)
    assert len(local) == len(remote) > 6
    for mine, theirs in zip(local, remote):  # DataLoader interleaves the workers' strides back into rank order
        assert mine.keys() == theirs.keys() == ["tokens", "loss_mask", "position_ids", "segment_ids"]
        for key in mine.keys():
            assert theirs[key].dtype == mine[key].dtype and np.array_equal(theirs[key], mine[key]), key
        tensors = theirs.to_torch()
        assert tensors["tokens"].dtype == torch.int32 and tensors["loss_mask"].dtype == torch.bool


def dead_pid() -> int:
    """A pid no process has: above the kernel's pid_max (as a pid of another PID namespace may look here)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def ring_holder() -> tuple[subprocess.Popen[str], str]:
    """A second process that made a ring (as a DataLoader worker does) and stays alive until its stdin closes."""
    code = ("import sys; from datahub.loader import worker_transport as t; r = t._ring(1 << 20); "
            "print(r.path, flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=str(Path(__file__).resolve().parents[2]))
    assert holder.stdout is not None
    return holder, holder.stdout.readline().strip()


def test_the_sweep_keeps_a_live_workers_ring_whatever_pid_it_names_and_removes_a_killed_ones() -> None:
    # a job in another PID namespace sharing /dev/shm (docker --ipc=host): its live worker's ring names a pid that
    # does not exist here. Renaming keeps the file (and the worker's hold on it) while its name shows that pid
    directory = worker_transport._ring_directory()
    holder, path = ring_holder()
    other_namespace = os.path.join(directory, f"{worker_transport._PREFIX}{dead_pid()}-{'2' * 32}")
    os.rename(path, other_namespace)
    killed, killed_path = ring_holder()
    killed.kill()  # SIGKILL: its exit handler never runs, so its ring file stays
    killed.wait()
    try:
        assert os.path.exists(killed_path)
        made = subprocess.run([sys.executable, "-c", "from datahub.loader import worker_transport as t; "
                               "print(t._ring(1 << 20).path)"], capture_output=True, text=True, check=True,
                              cwd=str(Path(__file__).resolve().parents[2]))
        assert os.path.exists(other_namespace), "a live worker's ring is kept, whatever pid its name shows"
        assert not os.path.exists(killed_path), "a killed worker's ring is removed by the next ring made"
        assert not os.path.exists(made.stdout.strip()), "a ring is unlinked when its process exits"
        holder.kill()  # now that worker is gone too
        holder.wait()
        worker_transport._sweep(directory)
        assert not os.path.exists(other_namespace), "once its worker is dead, the ring is removed"
    finally:
        for process in (holder, killed):
            if process.poll() is None:
                process.kill()
                process.wait()
        for stale in (other_namespace, killed_path):
            if os.path.exists(stale):
                os.unlink(stale)


def test_a_ring_is_sized_for_its_items_and_grows_when_full_or_outgrown() -> None:
    code = "\n".join([
        "from datahub.loader import worker_transport as t",
        "t._STALL_S = 0.01",
        "ring, _ = t._reserve(256 << 10)",  # _SLOTS (6) items of 256 KB: a 1.5 MiB ring, not the largest
        "print(ring.capacity)",
        "for _ in range(5): assert t._reserve(256 << 10)[0] is ring",
        "full, _ = t._reserve(256 << 10)",  # nothing released: full for _STALL_S, so a new ring twice as big
        "print(full is not ring, full.capacity)",
        "big, _ = t._reserve(3 << 20)",  # more than a quarter of that ring: one sized for it
        "print(big is not full, big.capacity, len(t._retired))",
        "print(t._capacity_for(4 << 10))",  # tiny items (token batches of a short seq_len): the smallest, 1 MiB
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[2])).stdout.split()
    assert out == [str(3 << 19), "True", str(3 << 20), "True", str(16 << 20), "2", str(1 << 20)], out


def test_rings_outgrown_by_larger_items_do_not_count_toward_the_ring_limit() -> None:
    # items that keep growing (a worker's first batches small, later ones large) make rings of 1, 1.8, 4.7 and 12 MiB
    # (_SLOTS of each, in 64 KiB steps): those are outgrown, not held by the trainer, so a trainer keeping batches afterwards still fills
    # _MAX_RINGS rings (the 12 MiB one and _MAX_RINGS - 1 new ones) before the pipe, as without the outgrown ones
    code = "\n".join([
        "from datahub.loader import worker_transport as t",
        "t._STALL_S = 0.01",
        "sizes = [100 << 10, 300 << 10, 800 << 10, 2 << 20]",
        "rings = [t._reserve(size)[0] for size in sizes]",
        "print([ring.capacity >> 16 for ring in rings], t._outgrown)",
        "kept = 0",
        "while t._reserve(2 << 20) is not None: kept += 1",  # nothing released: stalls, new rings, then the pipe
        "print(len(t._retired) - 3, kept > 8)",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[2])).stdout.split("\n")
    assert out[0].startswith("[16, 29, 75, 192]") and out[0].endswith(": 3}"), out
    assert out[1] == f"{worker_transport._MAX_RINGS} True", out


def test_a_batch_whose_ring_is_gone_is_an_error_that_says_so(tmp_path: Path) -> None:
    with pytest.raises(WorkerBatchLostError, match="shared-memory ring"):
        worker_transport._record_batch_from_ring(str(tmp_path / "datahub-ring-1-gone"), 0, 128, 128)


def test_a_batch_views_the_ring_and_frees_it_in_order_when_garbage(monkeypatch: pytest.MonkeyPatch) -> None:
    # the worker's side (reducer) and the trainer's side (unpickle) in one process: batches are views of the ring,
    # and the release mark moves past a batch only when it and every earlier batch are gone
    monkeypatch.setattr(worker_transport, "_rings", {})
    monkeypatch.setattr(worker_transport, "_made", {})
    monkeypatch.setattr(worker_transport, "_views", {})
    batches = [pa.record_batch({"text": [f"sample {i}-{j}" * 20 for j in range(50)]}) for i in range(3)]
    sent = [worker_transport._reduce_record_batch(batch) for batch in batches]
    ring = worker_transport._rings[os.getpid()]
    try:
        got = [rebuild(*args) for rebuild, args in sent]
        assert [g.to_pylist() for g in got] == [b.to_pylist() for b in batches]
        view = worker_transport._views[ring.path]
        address, start = got[0].column(0).buffers()[2].address, view.released.ctypes.data
        assert start < address < start + len(view.view), "the batch's text is a view of the trainer's ring mapping"
        ends = [args[-1] for _, args in sent]  # (rebuild, path, offset, size, end)
        column = got[1].column(0)  # a view of batch 1 that outlives the batch object
        del got[1]
        assert int(ring.released[0]) == 0, "batch 0 is alive: nothing is released"
        del got[0]
        assert int(ring.released[0]) == ends[0], "batch 0 gone; batch 1's column still views the ring"
        del column
        assert int(ring.released[0]) == ends[1]
        got.clear()
        assert int(ring.released[0]) == ends[2]
        assert view.idle()
    finally:
        unlink_quietly(ring.path)


def test_batches_the_trainer_drops_free_the_ring_for_the_next(text_release: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # a 64 KB ring holds a few batches; a trainer that drops each batch after use keeps one ring per worker.
    # _STALL_S long: the worker left at an epoch's end gets all four prefetched indices, and the trainer still holds
    # the previous batch while it takes the next: 6 of that worker's 12 KB batches alive, more than 64 KB. Its reserve
    # waits for the trainer to drop the previous batch, and a trainer paused over 50 ms right then (a loaded CI
    # machine) starts a second ring by design: the verdict must not depend on the machine's load
    monkeypatch.setattr(worker_transport, "_CAPACITY", 64 << 10)
    monkeypatch.setattr(worker_transport, "_MAX_ITEM", 16 << 10)
    monkeypatch.setattr(worker_transport, "_STALL_S", 60.0)
    monkeypatch.setattr(worker_transport, "_views", {})
    dataset = ReleaseDataset(text_release, rank=0, world_size=1, seed=3, shuffle_buffer=40, batch_size=16,
                             batch_format="arrow")
    seen: list[str] = []
    used: set[str] = set()  # the rings mapped while reading (a finished worker's is unmapped once idle)
    for batch in DataLoader(dataset, batch_size=None, num_workers=2):
        seen.extend(batch.column("sample_id").to_pylist())
        used |= set(worker_transport._views)
    assert sorted(seen) == sorted(by_id(arrow_batches(text_release, 0)))
    pids = [path.split(worker_transport._PREFIX)[1].split("-")[0] for path in used]
    assert len(pids) == len(set(pids)) == 2, f"one ring per worker: {sorted(used)}"


def test_a_trainer_keeping_every_batch_outgrows_the_default_rings(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # rings sized for _SLOTS batches (~112 KB batches: 1 MiB rings of 9) and a trainer that keeps them all (list,
    # 15 batches per worker): a worker finds its ring full, leaves it to the kept batches and starts a bigger one;
    # every batch stays intact
    write_release(tmp_path / "export", samples_per_shard=(80,) * 6, text_bytes=7000)
    path = str(tmp_path / "export" / "manifest.json")
    monkeypatch.setattr(worker_transport, "_STALL_S", 0.01)
    monkeypatch.setattr(worker_transport, "_views", {})
    kept = arrow_batches(path, 2)
    assert worker_transport._SLOTS * kept[0].nbytes < 1 << 20 < 10 * kept[0].nbytes
    assert by_id(kept) == by_id(arrow_batches(path, 0))
    pids = [name.split(worker_transport._PREFIX)[1].split("-")[0] for name in worker_transport._views]
    assert len(set(pids)) == 2 and len(pids) > 2, f"a worker started another ring: {list(worker_transport._views)}"


def test_arrow_batches_do_not_import_pandas(text_release: str) -> None:
    # pyarrow imports pandas on its first pa.array call: ~25 MB and ~240 mappings in the trainer that every
    # DataLoader worker's fork copies and its exit tears down; arrow batches are made from buffers instead
    code = "\n".join([
        "import sys",
        "from torch.utils.data import DataLoader",
        "from datahub.loader import ReleaseDataset",
        f"dataset = ReleaseDataset({text_release!r}, rank=0, world_size=1, batch_size=16, batch_format='arrow')",
        "rows = sum(b.num_rows for b in dataset) + sum(b.num_rows for b in DataLoader(dataset, batch_size=None, "
        "num_workers=2))",
        "print(rows, 'pandas' in sys.modules)",
    ])
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[2])).stdout.split()
    assert out == [str(2 * 187), "False"], out


def test_bundles_rebuild_from_ring_with_each_layout_parsed_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # the trainer parses a layout (dtypes, counts) once; a batch with another shape (an epoch's short last batch)
    # gets its own entry; arrays are views of the ring, equal to the sent ones
    monkeypatch.setattr(worker_transport, "_rings", {})
    monkeypatch.setattr(worker_transport, "_made", {})
    monkeypatch.setattr(worker_transport, "_views", {})
    monkeypatch.setattr(worker_transport, "_layouts", {})
    prefixes, _ = write_tokens(tmp_path / "tok", files=2, documents=40, max_len=50)
    batches = list(PackedDataset(prefixes, seq_len=32, batch_size=4, rank=0, world_size=1, seed=1))
    assert len(batches) > 3 and len(batches[-1]) < len(batches[0])
    try:
        sent = [worker_transport._reduce_bundle(batch) for batch in batches]
        got = [rebuild(*args) for rebuild, args in sent]
        assert len(worker_transport._layouts) == 2, "one parse for the full batches' layout, one for the last batch's"
        ring = worker_transport._rings[os.getpid()]
        view = worker_transport._views[ring.path]
        start = view.released.ctypes.data
        for mine, theirs in zip(batches, got):
            for key in mine.keys():
                assert np.array_equal(theirs[key], mine[key]), key
            assert start < theirs["tokens"].ctypes.data < start + len(view.view), "a view of the trainer's mapping"
        ends = [args[-1] for _, args in sent]
        got.clear()
        del mine, theirs  # the loop variables hold the last batch
        assert int(ring.released[0]) == ends[-1] and view.idle()
    finally:
        unlink_quietly(worker_transport._rings[os.getpid()].path)


@pytest.mark.parametrize("case", ["batches", "single", "no-boundaries", "padding-rank", "mixture"])
def test_a_token_batch_from_the_ring_pickles_and_repeats_as_the_batch_read_in_process(
        tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # only the made arrays cross the ring; a batch the trainer pickles again (a checkpointed batch, another queue)
    # or asks for its compact form derives it from them, and rebuilds every array as the worker made it
    import pickle

    from datahub.loader import MixtureDataset

    monkeypatch.setattr(worker_transport, "_rings", {})
    monkeypatch.setattr(worker_transport, "_made", {})
    monkeypatch.setattr(worker_transport, "_views", {})
    prefixes, _ = write_tokens(tmp_path / "tok", files=2, documents=30, max_len=50)
    settings: dict[str, Any] = {"seq_len": 32, "batch_size": 4, "seed": 1, "shuffle_buffer": 20}
    if case == "mixture":
        other, _ = write_tokens(tmp_path / "other", files=1, documents=20, max_len=40, first_id=10**6, name="o")
        dataset: Any = MixtureDataset({"a": PackedDataset(prefixes, **settings), "b": PackedDataset(other, **settings)},
                                      {"a": 0.5, "b": 0.5}, rank=0, world_size=1, batch_size=4)
    else:
        settings.update({"single": {"batch_size": None}, "no-boundaries": {"document_boundaries": False},
                         "padding-rank": {"world_size": 7, "rank": 6}}.get(case, {}))
        dataset = PackedDataset(prefixes, **{"rank": 0, "world_size": 1, **settings})
    batches = list(dataset)
    if case == "padding-rank":
        assert not batches[-1]["loss_mask"][-1].any(), "the rank's last sequence is padding"
    try:
        for batch in batches:
            rebuild, args = worker_transport._reduce_bundle(batch)
            got = rebuild(*args)
            assert got.keys() == batch.keys() and len(got) == len(batch)
            for key, value in batch.raw.items():
                assert np.array_equal(got.raw[key], value), key
            again = pickle.loads(pickle.dumps(got))
            assert again.keys() == batch.keys() and repr(again) and repr(got)
            for key in batch.keys():
                assert np.array_equal(again[key], batch[key]) and again[key].dtype == batch[key].dtype, key
                assert np.array_equal(got[key], batch[key]), key
    finally:
        unlink_quietly(worker_transport._rings[os.getpid()].path)


def test_trainer_threads_map_rings_at_once_without_breaking_the_view_table(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # two threads of the trainer unpickle batches of new rings at once (two DataLoaders' pin_memory threads, or one
    # and the main thread): one's cleanup of gone workers' mappings must not see the other's insert mid-iteration
    # ("dictionary changed size during iteration" killed a pin_memory thread)
    monkeypatch.setattr(worker_transport, "_views", {})
    errors: list[str] = []
    kept: list[memoryview] = []

    def unpickle(tag: str) -> None:
        try:
            for i in range(800):
                path = tmp_path / f"{tag}-{i}"
                path.write_bytes(bytes(worker_transport._HEADER + 64))
                region = worker_transport._region(str(path), 0, 8, 8)
                if i % 2:
                    kept.append(region)  # a batch kept: its mapping stays; the others' become idle (stat'ed)
        except Exception as error:  # noqa: BLE001 - the test reports what the thread hit
            errors.append(f"{type(error).__name__}: {error}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, as a busy trainer's would
    try:
        threads = [threading.Thread(target=unpickle, args=(tag,)) for tag in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert len(worker_transport._views) == 1600
    kept.clear()


def _unlink_ring_after(reduce: Any) -> Any:
    """A worker's reducer that removes the worker's ring file once the batch is written (as a /dev/shm cleaner that
    runs between the worker's write and the trainer's first read would): the trainer cannot map the ring."""
    def reduce_and_lose(item: Any) -> Any:
        out = reduce(item)
        ring = worker_transport._rings.get(os.getpid())
        if ring is not None and os.path.exists(ring.path):
            os.unlink(ring.path)
        return out
    return reduce_and_lose


def _lose_rings(worker_id: int) -> None:  # worker_init_fn: runs in the worker before the dataset's __iter__
    from multiprocessing.reduction import ForkingPickler

    from datahub.loader.packing import TokenBatch

    worker_transport.install((TokenBatch,))
    ForkingPickler.register(pa.RecordBatch, _unlink_ring_after(worker_transport._reduce_record_batch))
    ForkingPickler.register(TokenBatch, _unlink_ring_after(worker_transport._reduce_bundle))


@pytest.fixture
def pin_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """DataLoader(pin_memory=True) starts torch's own pin thread (``_pin_memory_loop``, which unpickles the workers'
    batches there) on this CPU-only machine: torch skips it without an accelerator, so it is told there is one, at
    device index -1 (which ``torch.accelerator.set_device_index`` accepts here). Pinning itself is not run."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: -1)


@pytest.mark.parametrize("pin_memory", [True, False], ids=["pin-thread", "no-pin"])
@pytest.mark.parametrize("kind", ["text", "tokens"])
def test_a_lost_ring_batch_reaches_the_trainer_as_its_own_error_through_the_pin_thread(
        tmp_path: Path, text_release: str, kind: str, pin_memory: bool, request: pytest.FixtureRequest) -> None:
    if pin_memory:
        request.getfixturevalue("pin_thread")
    if kind == "text":
        dataset: Any = ReleaseDataset(text_release, rank=0, world_size=1, batch_size=16, batch_format="arrow")
    else:
        prefixes, _ = write_tokens(tmp_path / "tok", files=2, documents=30, max_len=50)
        dataset = PackedDataset(prefixes, seq_len=64, batch_size=4, rank=0, world_size=1)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, pin_memory=pin_memory, worker_init_fn=_lose_rings)
    if pin_memory:
        assert loader._get_iterator()._pin_memory, "torch's pin thread runs"
    # before: "RuntimeError: Pin memory thread exited unexpectedly" (the unpickling error killed the pin thread)
    with pytest.raises(WorkerBatchLostError, match="gone from its shared-memory ring"):
        next(iter(loader))


def old_ring(path: str, *, hold: bool) -> subprocess.Popen[str]:
    """A ring made as datahub before the flock rule made it (``datahub-ring-<pid>-<hex>``: created, sized, mapped,
    descriptor closed, no flock), by a process that stays alive until its stdin closes (``hold``) or exits at once
    (its file left behind as a SIGKILLed worker's)."""
    code = "\n".join([
        "import mmap, os, sys",
        f"handle = os.open({path!r}, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)",
        "os.posix_fallocate(handle, 0, 1 << 16)",
        "ring = mmap.mmap(handle, 1 << 16)",
        "os.close(handle)",
        "print('made', flush=True)",
        "sys.stdin.read()" if hold else "os._exit(0)",
    ])
    maker = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert maker.stdout is not None and maker.stdout.readline().strip() == "made"
    return maker


def test_the_sweep_removes_old_named_rings_no_process_maps_and_keeps_live_ones() -> None:
    # rings of datahub before the flock sweep stayed in /dev/shm for good (the sweep matched only the new names);
    # their workers hold no flock, so only a ring nobody has mapped (its worker and trainer gone) may go
    directory = worker_transport._ring_directory()
    live = os.path.join(directory, f"datahub-ring-{dead_pid()}-{'3' * 32}")  # a live worker of another PID namespace
    stale = os.path.join(directory, f"datahub-ring-{dead_pid()}-{'4' * 32}")  # a killed worker's, nobody maps it
    other = os.path.join(directory, f"datahub-ring-{dead_pid()}-notes")  # not a ring's name: not ours to judge
    holder = old_ring(live, hold=True)
    old_ring(stale, hold=False).wait()
    Path(other).write_bytes(b"x")
    try:
        worker_transport._sweep(directory)
        assert os.path.exists(live), "a ring a live process maps is kept"
        assert not os.path.exists(stale), "an old ring no process holds is removed"
        assert os.path.exists(other)
        holder.kill()
        holder.wait()
        made = subprocess.run([sys.executable, "-c", "from datahub.loader import worker_transport as t; "
                               "print(t._ring(1 << 20).path)"], capture_output=True, text=True, check=True,
                              cwd=str(Path(__file__).resolve().parents[2]))
        assert made.stdout.strip().startswith(os.path.join(directory, worker_transport._PREFIX))
        assert not os.path.exists(live), "once its process is gone, the next ring made removes it"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for path in (live, stale, other):
            if os.path.exists(path):
                os.unlink(path)


@functools.lru_cache(maxsize=None)
def pages_not_given_back() -> str | None:
    """Why the ring directory cannot give pages back (None: it can), probed as ``free_unused`` does it: a file in
    ``_ring_directory()`` (/dev/shm, else the temp directory), reserved, mapped, and ``MADV_REMOVE`` on its pages,
    which must drop its allocated blocks. A CI machine without a writable /dev/shm, or whose filesystem punches no
    holes, keeps a kept batch's whole ring: the loader's batches are still right, only that memory is not saved."""
    directory = worker_transport._ring_directory()
    page = mmap.PAGESIZE
    if page != 4096:
        return f"pages of {page} bytes (the KiB bounds here count 4 KiB pages)"
    handle, path = tempfile.mkstemp(prefix="datahub-probe-", dir=directory)
    try:
        os.posix_fallocate(handle, 0, 4 * page)
        held = os.fstat(handle).st_blocks
        with mmap.mmap(handle, 4 * page) as mapping:
            try:
                mapping.madvise(mmap.MADV_REMOVE, page, 2 * page)
            except (OSError, ValueError, AttributeError) as error:
                return f"{directory} gives no pages back (MADV_REMOVE: {error!r})"
        left = os.fstat(handle).st_blocks
        if left >= held:
            return f"{directory} gives no pages back (MADV_REMOVE left {left} of {held} blocks allocated)"
        return None
    finally:
        os.close(handle)
        os.unlink(path)


def gone_rings() -> dict[str, int]:
    """Ring files already removed (their worker exited) that this process still maps: path -> KiB they hold in
    /dev/shm (a mapping keeps a removed file's pages; Python's mmap keeps a descriptor of the file, stat'ed here)."""
    held: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if worker_transport._PREFIX in target and target.endswith(" (deleted)"):
                held[target[: -len(" (deleted)")]] = os.stat(f"/proc/self/fd/{fd}").st_blocks // 2
        except OSError:  # closed meanwhile
            continue
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[5] for line in maps if worker_transport._PREFIX in line and "(deleted)" in line}
    return {path: kib for path, kib in held.items() if path in mapped}


@pytest.mark.parametrize("kind", ["text", "tokens"])
def test_a_finished_epochs_rings_are_unmapped_before_the_next_epochs_workers_make_theirs(
        tmp_path: Path, text_release: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # fresh workers every epoch (persistent_workers=False): each epoch's workers make new rings and remove their files
    # at exit, but the trainer kept mapping them (a removed file's pages stay in /dev/shm while mapped) until the next
    # epoch's first batch, after the new workers had made theirs: twice the rings' memory at every epoch start, and
    # the last epoch's for the rest of the process
    monkeypatch.setattr(worker_transport, "_views", {})
    dataset: Any
    if kind == "text":
        dataset = ReleaseDataset(text_release, rank=0, world_size=1, seed=3, shuffle_buffer=40, batch_size=16,
                                 batch_format="arrow")
    else:
        prefixes, _ = write_tokens(tmp_path / "tok", files=2, documents=40, max_len=50)
        dataset = PackedDataset(prefixes, seq_len=64, batch_size=4, rank=0, world_size=1, seed=2)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    used: set[str] = set()
    for batch in loader:
        used |= set(worker_transport._views)
    assert len(used) == 2
    del batch  # noqa: F821 - the loop ran
    assert not used & set(gone_rings()), "the epoch's batches are gone and its workers exited"

    # a trainer that keeps the epoch's last batch over set_epoch (the README's loop: `batch` outlives the loop): the
    # ring stays mapped for it and the batch is intact (the pages given back are tested below, where the ring
    # directory punches holes)
    used.clear()
    dataset.set_epoch(1)
    for batch in loader:
        used |= set(worker_transport._views)
    assert len(used) == 2
    kept = batch.column("text").to_pylist() if kind == "text" else batch["tokens"].copy()
    dataset.set_epoch(2)
    assert len(used & set(gone_rings())) <= 1
    if kind == "text":
        assert batch.column("text").to_pylist() == kept
    else:
        assert np.array_equal(batch["tokens"], kept)
    del batch
    assert not used & set(gone_rings())


def test_a_ring_removed_from_dev_shm_while_its_worker_lives_is_neither_unmapped_nor_given_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # someone cleans /dev/shm (rm) while a worker still writes its ring: the file is gone but the worker is not
    # finished (it holds its flock); the trainer must keep the mapping and never give back pages the worker writes
    # a batch into after the trainer's last one (the worker's and trainer's sides in one process, as above)
    monkeypatch.setattr(worker_transport, "_rings", {})
    monkeypatch.setattr(worker_transport, "_made", {})
    monkeypatch.setattr(worker_transport, "_views", {})
    batches = [pa.record_batch({"text": [f"sample {i}-{j}" * 40 for j in range(60)]}) for i in range(3)]
    sent = [worker_transport._reduce_record_batch(batch) for batch in batches[:2]]
    ring = worker_transport._rings[os.getpid()]
    got = [rebuild(*args) for rebuild, args in sent]
    os.unlink(ring.path)
    del got[0]
    rebuild, args = worker_transport._reduce_record_batch(batches[2])  # in the pipe, not yet read by the trainer
    worker_transport.release_finished_rings()  # what set_epoch calls
    assert ring.path in worker_transport._views
    assert rebuild(*args).to_pylist() == batches[2].to_pylist()
    got.clear()
    worker_transport.release_finished_rings()
    assert ring.path in worker_transport._views, "idle, but its worker lives"


def _copy(batch: Any) -> Any:
    return batch.to_pydict() if isinstance(batch, pa.RecordBatch) else {k: batch[k].copy() for k in batch.keys()}


def _same(batch: Any, copy: Any) -> bool:
    if isinstance(batch, pa.RecordBatch):
        return bool(batch.to_pydict() == copy)
    return all(np.array_equal(batch[key], value) for key, value in copy.items())


@pytest.mark.parametrize("kind", ["text", "tokens"])
def test_batches_kept_past_their_epoch_hold_only_their_own_pages_of_the_finished_rings(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a trainer keeps an epoch's first, a middle and the last batch (logging, a batch to replay) over set_epoch: each
    # finished ring stays mapped for them, but gives back every page no kept batch uses. Before, only the pages past
    # the ring's newest batch went: a ring whose first batch was kept held the whole epoch's stream (15 batches)
    reason = pages_not_given_back()
    if reason is not None:
        pytest.skip(f"{reason}: the loader's batches stay right, but a kept batch's ring is not trimmed there")
    monkeypatch.setattr(worker_transport, "_views", {})
    dataset: Any
    if kind == "text":
        write_release(tmp_path / "export", samples_per_shard=(80,) * 6, text_bytes=700)
        dataset = ReleaseDataset(str(tmp_path / "export" / "manifest.json"), rank=0, world_size=1, seed=3,
                                 shuffle_buffer=40, batch_size=16, batch_format="arrow")
    else:
        prefixes, _ = write_tokens(tmp_path / "tok", files=2, documents=600, max_len=50)
        dataset = PackedDataset(prefixes, seq_len=128, batch_size=4, rank=0, world_size=1, seed=2)
    kept: list[tuple[Any, Any]] = []
    used: set[str] = set()
    for step, batch in enumerate(DataLoader(dataset, batch_size=None, num_workers=2)):
        used |= set(worker_transport._views)
        if step in (0, 5):
            kept.append((batch, _copy(batch)))
    kept.append((batch, _copy(batch)))
    del batch
    assert len(used) == 2 and len(kept) == 3
    dataset.set_epoch(1)
    gone = {path: kib for path, kib in gone_rings().items() if path in used}
    assert len(gone) == 2, "both rings hold a kept batch"
    # each ring's header page and its kept batches' pages (a batch is 12 KiB of text or 7 KiB of tokens: at most 4
    # pages with its edges): at most 56 KiB (36-52 here). Before: 350-410 KiB (the stream from each ring's
    # release mark to its newest batch; over 170 KiB for the ring whose first batch was kept alone)
    assert sum(gone.values()) <= 96, f"KiB the finished rings hold in /dev/shm: {gone}"
    assert all(_same(batch, copy) for batch, copy in kept), "the kept batches are intact"
    kept.clear()
    assert not used & set(gone_rings())


def test_a_finished_rings_pages_between_and_around_kept_batches_are_given_back_across_the_wrap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # one 64 KiB ring that wraps (the worker's and trainer's sides in one process, as above): the trainer drops most
    # batches and keeps one before the wrap, the first after it and the newest; giving back the unused pages (what
    # set_epoch does once the worker exited) keeps every kept batch's bytes, and the ring holds little more than them
    reason = pages_not_given_back()
    if reason is not None:
        pytest.skip(f"{reason}: the loader's batches stay right, but a kept batch's ring is not trimmed there")
    monkeypatch.setattr(worker_transport, "_rings", {})
    monkeypatch.setattr(worker_transport, "_made", {})
    monkeypatch.setattr(worker_transport, "_views", {})
    monkeypatch.setattr(worker_transport, "_MIN_CAPACITY", 64 << 10)
    batches = [pa.record_batch({"text": [f"sample {i}-{j} " * 25 for j in range(20)]}) for i in range(17)]
    kept: list[tuple[pa.RecordBatch, dict[str, Any]]] = []
    ends: list[int] = []
    try:
        for i, batch in enumerate(batches):
            rebuild, args = worker_transport._reduce_record_batch(batch)
            ends.append(args[-1])
            got = rebuild(*args)
            capacity = worker_transport._rings[os.getpid()].capacity
            # batch 8, the first past the wrap (at offset 0 and over 4 KiB: past page 0, which is always kept; the
            # ring's tail skipped before it is given back) and the newest
            if i in (8, len(batches) - 1) or ends[i - 1] < capacity < ends[i]:
                kept.append((got, batch.to_pydict()))
            del got  # the others are dropped at once, so the ring never fills
        ring = worker_transport._rings[os.getpid()]
        assert worker_transport._made == {os.getpid(): 1} and ring.capacity == 64 << 10
        assert len(kept) == 3 and ends[8] < ring.capacity < ends[-2], "kept batches on both sides of the wrap"
        view = worker_transport._views[ring.path]
        view.free_unused()
        assert all(got.to_pydict() == copy for got, copy in kept), "the kept batches are intact"
        held = os.stat(ring.path).st_blocks // 2
        # the header page and each kept batch's (6 KiB: at most 3 pages): 40 KiB at most;
        # 32 KiB here; before, the stream from the first kept batch to the newest stayed (68 KiB here)
        assert held <= 40, f"KiB the ring holds: {held}"
    finally:
        kept.clear()
        unlink_quietly(worker_transport._rings[os.getpid()].path)
