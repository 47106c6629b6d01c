"""Persistent DataLoader workers (``persistent_workers=True``) follow the owner's ``set_epoch`` and
``load_state_dict``: each epoch (and each resume) reads what a DataLoader with fresh workers reads."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from datahub.loader import PackedDataset, ReleaseDataset  # noqa: E402
from datahub.loader.errors import ConsumedCountRequiredError  # noqa: E402
from datahub.loader.mixture import MixtureDataset  # noqa: E402
from tests.loader.shards import write_release  # noqa: E402
from tests.loader.tokens import write_tokens  # noqa: E402


def tokens(batch: Any) -> tuple[tuple[str, bytes], ...]:
    return tuple((key, np.asarray(value).tobytes()) for key, value in batch.items())


def samples(batch: Any) -> tuple[tuple[str, str, bool], ...]:
    return tuple((s.get("source", ""), s["sample_id"], s["is_padding"]) for s in batch)


def read(loader: DataLoader, as_key: Callable[[Any], Any], stop: int | None = None) -> list[Any]:
    out = []
    for batch in loader:
        out.append(as_key(batch))
        if len(out) == stop:
            break
    return out


def follows_the_owner(make: Callable[[], Any], as_key: Callable[[Any], Any], **load: Any) -> None:
    """Epochs, a mid-epoch resume (``load`` as keyword arguments of load_state_dict) and the next epoch through one
    persistent DataLoader equal the same steps through DataLoaders with fresh workers."""
    persistent_dataset, fresh_dataset = make(), make()
    persistent = DataLoader(persistent_dataset, batch_size=None, num_workers=2, persistent_workers=True)

    def both(step: Callable[[Any], None], stop: int | None = None) -> list[Any]:
        step(persistent_dataset)
        step(fresh_dataset)
        got = read(persistent, as_key, stop)
        want = read(DataLoader(fresh_dataset, batch_size=None, num_workers=2), as_key, stop)
        assert got == want
        return got

    first = both(lambda dataset: None)
    second = both(lambda dataset: dataset.set_epoch(1), stop=3)
    assert second != first[:3], "epoch 1 is another order than epoch 0"
    state = persistent_dataset.state_dict(consumed=3)
    rest = both(lambda dataset: dataset.load_state_dict(state, **load))
    assert rest and rest[0] not in second, "the resume continues after the 3 batches received"
    third = both(lambda dataset: dataset.set_epoch(2))
    assert third != first


def test_persistent_workers_follow_set_epoch_and_load_state_dict_of_packed_dataset(tmp_path: Path) -> None:
    prefixes, _ = write_tokens(tmp_path / "tok", files=4, documents=60, max_len=60)
    follows_the_owner(lambda: PackedDataset(prefixes, seq_len=32, batch_size=3, rank=0, world_size=1, seed=3),
                      tokens)


def test_persistent_workers_follow_set_epoch_and_load_state_dict_of_release_dataset(tmp_path: Path) -> None:
    write_release(tmp_path / "export", samples_per_shard=(10, 9, 11, 10, 8, 12))
    path = str(tmp_path / "export" / "manifest.json")
    follows_the_owner(lambda: ReleaseDataset(path, rank=0, world_size=1, seed=5, shuffle_buffer=10, batch_size=4),
                      samples)


def test_persistent_workers_follow_a_token_mixture_resumed_with_other_weights(tmp_path: Path) -> None:
    a, _ = write_tokens(tmp_path / "a", files=3, documents=20, name="a")
    b, _ = write_tokens(tmp_path / "b", files=2, documents=25, first_id=10**6, name="b")
    settings: dict[str, Any] = {"seq_len": 16, "shuffle_buffer": 30}

    def make() -> MixtureDataset:
        return MixtureDataset({"a": PackedDataset(a, **settings), "b": PackedDataset(b, **settings)},
                              {"a": 0.75, "b": 0.25}, rank=0, world_size=1, batch_size=2)

    follows_the_owner(make, tokens, weights={"a": 0.25, "b": 0.75})  # weights and cursors reach the workers


def _deep(dataset: Any) -> Any:
    return copy.deepcopy(dataset)


def _pickled(dataset: Any) -> Any:
    return pickle.loads(pickle.dumps(dataset))


def _shallow(dataset: Any) -> Any:
    return copy.copy(dataset)


def _release(tmp_path: Path) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    write_release(tmp_path / "export", samples_per_shard=(10, 9, 11, 10, 8, 12))
    path = str(tmp_path / "export" / "manifest.json")
    return lambda: ReleaseDataset(path, rank=0, world_size=1, seed=5, shuffle_buffer=10, batch_size=4), samples


def _packed(tmp_path: Path) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    prefixes, _ = write_tokens(tmp_path / "tok", files=4, documents=60, max_len=60)
    return lambda: PackedDataset(prefixes, seq_len=32, batch_size=3, rank=0, world_size=1, seed=3), tokens


@pytest.mark.parametrize("clone", [_deep, _pickled, _shallow], ids=["deepcopy", "pickle", "copy"])
@pytest.mark.parametrize("kind", [_release, _packed], ids=["release", "packed"])
def test_a_copy_of_a_dataset_has_its_own_position_for_persistent_workers(
        tmp_path: Path, kind: Callable[[Path], Any], clone: Callable[[Any], Any]) -> None:
    # an evaluation copy (or a dataset restored from a pickle) moved to its own epoch and resume point must not move
    # the original's persistent workers: each epoch of the original reads what fresh workers read
    make, as_key = kind(tmp_path)
    original = make()
    persistent = DataLoader(original, batch_size=None, num_workers=2, persistent_workers=True)
    read(persistent, as_key)  # the workers start, with epoch 0
    twin = clone(original)
    original.set_epoch(1)
    twin.set_epoch(7)
    twin.load_state_dict(twin.state_dict(consumed=2))
    reference = make()
    reference.set_epoch(1)
    want = read(DataLoader(reference, batch_size=None, num_workers=2), as_key)
    assert read(persistent, as_key) == want, "the original's workers read the original's epoch 1"
    twins = DataLoader(twin, batch_size=None, num_workers=2, persistent_workers=True)
    reference.set_epoch(7)
    reference.load_state_dict(reference.state_dict(consumed=2))
    assert read(twins, as_key) == read(DataLoader(reference, batch_size=None, num_workers=2), as_key)
    original.set_epoch(2)  # and the twin's workers follow the twin, not the original
    twin.set_epoch(3)
    reference.set_epoch(3)
    assert read(twins, as_key) == read(DataLoader(reference, batch_size=None, num_workers=2), as_key)


@pytest.mark.parametrize("clone", [_deep, _pickled, _shallow], ids=["deepcopy", "pickle", "copy"])
@pytest.mark.parametrize("kind", [_release, _packed], ids=["release", "packed"])
def test_a_copy_read_in_process_leaves_the_original_refusing_a_position_it_cannot_know(
        tmp_path: Path, kind: Callable[[Path], Any], clone: Callable[[Any], Any]) -> None:
    # the original was read by DataLoader workers, so its state_dict() needs consumed=N; a copy read in this process
    # must not make it answer "nothing consumed" (a resume from the epoch's start: every sample read again)
    make, as_key = kind(tmp_path)
    original = make()
    got = read(DataLoader(original, batch_size=None, num_workers=2), as_key, stop=2)
    assert len(got) == 2
    twin = clone(original)
    with pytest.raises(ConsumedCountRequiredError):  # a snapshot of the original: it does not know either
        twin.state_dict()
    twin.set_epoch(1)  # the copy moves on and is read in this process: its own count is its trainer's
    read(twin, as_key, stop=1)  # type: ignore[arg-type]  # iterated here, num_workers=0
    assert twin.state_dict()["epoch"] == 1
    with pytest.raises(ConsumedCountRequiredError):
        original.state_dict()


def test_spawned_persistent_workers_still_share_the_owners_position(tmp_path: Path) -> None:
    # a spawned worker's copy is pickled (by multiprocessing's ForkingPickler): unlike a user's pickle, it must keep
    # the owner's files, or set_epoch would not reach it and state_dict() would not know workers read the dataset
    make, as_key = _release(tmp_path)
    original, reference = make(), make()
    spawned = DataLoader(original, batch_size=None, num_workers=2, persistent_workers=True,
                         multiprocessing_context="spawn")
    assert read(spawned, as_key) == read(DataLoader(reference, batch_size=None, num_workers=2), as_key)
    with pytest.raises(ConsumedCountRequiredError):
        original.state_dict()
    original.set_epoch(1)
    reference.set_epoch(1)
    assert read(spawned, as_key) == read(DataLoader(reference, batch_size=None, num_workers=2), as_key)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "fresh"])
def test_a_look_at_the_dataset_in_process_does_not_change_what_consumed_counts(tmp_path: Path,
                                                                               persistent: bool) -> None:
    # state_dict(consumed=N) counts the DataLoader's batches, split over its workers; a next(iter(dataset)) in this
    # process while they read (to log a sample) made it count N batches of one in-process stream: 8 of 60 samples
    # repeated and 8 skipped by the resume
    make, _ = _release(tmp_path)
    dataset = make()
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=persistent)
    batches = iter(loader)
    read_ids = []
    for step in range(5):
        read_ids += [sample["sample_id"] for sample in next(batches)]
        if step == 2:
            next(iter(dataset))
    state = dataset.state_dict(consumed=5)
    del batches
    resumed = make()
    resumed.load_state_dict(state)
    read_ids += [sample["sample_id"] for batch in DataLoader(resumed, batch_size=None, num_workers=2)
                 for sample in batch]
    assert sorted(read_ids) == sorted(set(read_ids)) and len(read_ids) == 60, "every sample exactly once"


@pytest.mark.parametrize("kind", [_release, _packed], ids=["release", "packed"])
def test_a_stateful_dataloader_resume_serves_one_pass_of_persistent_workers(tmp_path: Path,
                                                                            kind: Callable[[Path], Any]) -> None:
    # StatefulDataLoader loads its checkpoint into each worker's copy; a persistent worker kept it, so the pass after
    # the resumed one (no set_epoch: the same epoch again, as fresh workers read it) started at the checkpoint again
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    make, as_key = kind(tmp_path)
    first = stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    batches = iter(first)
    for _ in range(4):
        next(batches)
    state = first.state_dict()
    del batches

    def resumed(persistent: bool) -> tuple[list[Any], list[Any]]:
        loader = stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2, persistent_workers=persistent)
        loader.load_state_dict(state)
        return read(loader, as_key), read(loader, as_key)

    rest, again = resumed(persistent=True)
    fresh_rest, fresh_again = resumed(persistent=False)
    assert rest == fresh_rest and len(rest) < len(again)
    assert again == fresh_again, "the next pass reads the whole epoch, as with fresh workers"


TRAINER = """
import json, os, sys, tempfile
from torch.utils.data import DataLoader
from datahub.loader import ReleaseDataset
from datahub.loader.errors import ConsumedCountRequiredError
dataset = ReleaseDataset(sys.argv[1], rank=0, world_size=1, seed=5, batch_size=4)
loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
for _ in loader:
    pass
dataset.set_epoch(1)  # the position file its persistent workers read
ours = os.path.join(tempfile.gettempdir(), "datahub-loader-")
held = []
for fd in os.listdir("/proc/self/fd"):  # what this process holds open there (its lock, if it takes one)
    try:
        held.append(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # the listing's own descriptor, closed since
        pass
print(json.dumps({"marker": dataset._worker_use.path, "position": dataset._position.path,
                  "held": sorted(path for path in held if path.startswith(ours))}), flush=True)
sys.stdin.readline()
try:
    dataset.state_dict()
    print("counted", flush=True)
except ConsumedCountRequiredError:
    print("refused", flush=True)
"""


def trainer(release: str, *prefix: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A trainer process whose persistent DataLoader workers read an epoch, then ``set_epoch(1)``: its worker marker
    and position files exist; it waits for a line on stdin, then says whether ``state_dict()`` is refused."""
    process = subprocess.Popen([*prefix, sys.executable, "-c", TRAINER, release], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, "the trainer failed"
    return process, json.loads(line)


def _other_pid_namespace() -> tuple[str, ...]:
    prefix = ("unshare", "--pid", "--fork")
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --pid is not available here (needs root or user namespaces)")
    return prefix


@pytest.mark.parametrize("live_in", ["this-pid-namespace", "another-pid-namespace"])
def test_a_killed_trainers_files_are_removed_by_the_next_dataset_and_a_live_ones_kept(tmp_path: Path,
                                                                                    live_in: str) -> None:
    # a SIGKILLed trainer's finalizers never run: its worker marker and position files stayed in the temp dir for
    # good. The next dataset made on the machine removes them, and never a live trainer's, whatever its PID namespace
    # (a job in another container sharing /tmp)
    write_release(tmp_path / "export", samples_per_shard=(10, 9, 11, 10, 8, 12))
    release = str(tmp_path / "export" / "manifest.json")
    live, live_files = trainer(release, *(_other_pid_namespace() if live_in == "another-pid-namespace" else ()))
    killed, killed_files = trainer(release)
    try:
        killed.kill()  # SIGKILL, as the OOM killer or a preempted job does
        killed.wait()
        left = [killed_files["marker"], killed_files["position"], *killed_files["held"]]
        assert all(os.path.exists(path) for path in left)
        subprocess.run([sys.executable, "-c", "import sys; from datahub.loader import ReleaseDataset; "
                        "ReleaseDataset(sys.argv[1], rank=0, world_size=1)", release], check=True,
                       cwd=str(Path(__file__).resolve().parents[2]))
        assert [path for path in left if os.path.exists(path)] == [], "the killed trainer's files are removed"
        kept = [live_files["marker"], live_files["position"], *live_files["held"]]
        assert all(os.path.exists(path) for path in kept), "a live trainer's files are kept"
        stdout, _ = live.communicate("go\n", timeout=60)
        assert stdout.strip() == "refused", "its DataLoader workers read it: state_dict() still needs consumed="
        assert live.returncode == 0
        assert [path for path in kept if os.path.exists(path)] == [], "a trainer that exits removes its files"
    finally:
        for process in (live, killed):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_the_sweep_removes_only_files_of_an_owner_file_it_can_lock(tmp_path: Path) -> None:
    # a file whose owner cannot be judged stays: named by datahub before the owner rule (its live owner held
    # nothing), an owner file missing, or a name that is not exactly ours. Removing a live trainer's marker or
    # position would silently change what it resumes from
    from datahub.loader import worker_use

    gone, live, orphan = "5" * 32, "6" * 32, "7" * 32
    (tmp_path / f"datahub-loader-owner-{gone}").touch()
    (tmp_path / f"datahub-loader-owner-{live}").touch()
    removed = [f"datahub-loader-owner-{gone}", f"datahub-loader-workers-{gone}-{'a' * 32}",
               f"datahub-loader-position-{gone}-{'b' * 32}", f"datahub-loader-position-{gone}-{'b' * 32}-77.partial"]
    kept = [f"datahub-loader-owner-{live}", f"datahub-loader-workers-{live}-{'a' * 32}",
            f"datahub-loader-workers-{'c' * 32}", f"datahub-loader-position-{'d' * 32}",
            f"datahub-loader-workers-{orphan}-{'e' * 32}", f"datahub-loader-workers-{gone}-notes"]
    for name in removed + kept:
        (tmp_path / name).touch()
    holder = os.open(tmp_path / f"datahub-loader-owner-{live}", os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_SH)  # as a live owner holds its file
        worker_use._sweep(str(tmp_path), keep="")
    finally:
        os.close(holder)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(kept)
