"""The loader's verdict store (datahub.loader.verified): verdicts named by file identity, removed by name on eviction,
and the store pruned at most once a day (unused verdicts, leftovers, the older format)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from datahub.loader import verified
from datahub.loader.verified import PRUNE_EVERY_S, PRUNE_UNUSED_S, VerifiedFiles, prune_store

DAY = 86_400


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_forget_removes_the_verdict_by_name_without_listing_the_store(tmp_path: Path, monkeypatch) -> None:
    store = tmp_path / "store"
    writer = VerifiedFiles(store)
    for n in range(50):
        assert writer.check(f"{n:064x}", (1, n, 10, 1, 1), lambda: True)
    evicted = (1, 7, 10, 1, 1)
    evictor = VerifiedFiles(store)  # another process (a DataLoader worker) that never checked that file

    def no_listing(*args, **kwargs):
        raise AssertionError("forget listed the verdict store")

    monkeypatch.setattr(os, "scandir", no_listing)
    monkeypatch.setattr(os, "listdir", no_listing)
    evictor.forget(f"{7:064x}"[:16], evicted)
    monkeypatch.undo()
    hashed: list[int] = []
    assert VerifiedFiles(store).check(f"{7:064x}", evicted, lambda: hashed.append(1) or True) and hashed == [1]
    assert VerifiedFiles(store).check(f"{8:064x}", (1, 8, 10, 1, 1), lambda: False)  # the others stay


def test_a_verdict_counts_only_for_the_sha256_it_was_checked_against(tmp_path: Path) -> None:
    store = VerifiedFiles(tmp_path / "store")
    identity = (1, 1, 10, 1, 1)
    assert store.check("a" * 64, identity, lambda: True)
    hashed: list[int] = []
    assert VerifiedFiles(tmp_path / "store").check("b" * 64, identity, lambda: hashed.append(1) or False) is False
    assert hashed == [1]
    assert VerifiedFiles(tmp_path / "store").check("a" * 64, identity, lambda: False)  # still verified for a


def test_prune_removes_unused_verdicts_leftovers_and_the_older_format_once_a_day(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = VerifiedFiles(directory)  # a new store: pruned (nothing to do) and stamped
    assert (directory / ".pruned").exists()
    for n in range(4):
        store.check(f"{n:064x}", (1, n, 10, 1, 1), lambda: True)
    unused, in_use = directory / "1-0-10-1-1", directory / "1-1-10-1-1"
    _age(unused, PRUNE_UNUSED_S + DAY)
    _age(in_use, PRUNE_UNUSED_S - 3 * DAY)
    old_lock, fresh_lock = directory / "1-2-10-1-1.lock", directory / "1-3-10-1-1.lock"
    for leftover in (old_lock, fresh_lock):
        leftover.touch()
    _age(old_lock, 2 * DAY)
    old_format = directory / ("ab" * 16 + "-1-9-10-1-1")  # a verdict of the older format: sha256 prefix + identity
    old_format.touch()

    assert prune_store(str(directory)) is None  # pruned when the store was opened: not due yet
    assert unused.exists()
    _age(directory / ".pruned", PRUNE_EVERY_S + 60)  # a day later
    assert prune_store(str(directory)) == 3
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [".pruned", in_use.name, "1-2-10-1-1", "1-3-10-1-1", fresh_lock.name])
    assert prune_store(str(directory)) is None  # once a day
    assert prune_store(str(directory), now=time.time() + PRUNE_EVERY_S + 60) == 1  # the next day: the lock is old


def test_opening_a_store_prunes_it_when_due_and_reading_a_verdict_keeps_it(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    VerifiedFiles(directory).check("c" * 64, (2, 1, 10, 1, 1), lambda: True)
    VerifiedFiles(directory).check("d" * 64, (2, 2, 10, 1, 1), lambda: True)
    read, unread = directory / "2-1-10-1-1", directory / "2-2-10-1-1"
    _age(read, PRUNE_UNUSED_S - DAY)
    _age(unread, PRUNE_UNUSED_S - DAY)
    assert VerifiedFiles(directory).check("c" * 64, (2, 1, 10, 1, 1), lambda: False)  # read: re-dated
    assert time.time() - read.stat().st_mtime < 60

    _age(read, 0)
    _age(unread, PRUNE_UNUSED_S + DAY)  # then a month passes without a read of it
    VerifiedFiles(directory)
    assert unread.exists()  # the store was pruned today already
    _age(directory / ".pruned", PRUNE_EVERY_S + 60)
    VerifiedFiles(directory)
    assert read.exists() and not unread.exists()


def test_a_store_being_pruned_elsewhere_is_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    VerifiedFiles(directory)
    stale = directory / "3-1-10-1-1"
    stale.write_text("e" * 64)
    _age(stale, PRUNE_UNUSED_S + DAY)
    _age(directory / ".pruned", PRUNE_EVERY_S + 60)
    other = os.open(directory / ".pruned", os.O_RDWR)  # another process holds the pruning lock
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        assert prune_store(str(directory)) is None
        assert stale.exists()
    finally:
        os.close(other)
    assert prune_store(str(directory)) == 1 and not stale.exists()


def test_a_store_that_cannot_be_pruned_still_verifies(tmp_path: Path, monkeypatch) -> None:
    def failing(directory: str, *, now: float | None = None) -> int | None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(verified, "prune_store", failing)
    store = VerifiedFiles(tmp_path / "store")
    assert store.directory == str(tmp_path / "store")
    assert store.check("f" * 64, (4, 1, 10, 1, 1), lambda: True)
    assert VerifiedFiles(tmp_path / "store").check("f" * 64, (4, 1, 10, 1, 1), lambda: False)


def test_prune_removes_only_names_the_store_writes(tmp_path: Path) -> None:
    """``verdicts_dir`` is the user's choice: their files there (however old, even ``*.lock`` or names close to a
    verdict's) survive pruning; old verdicts, leftover locks and older-format markers still go."""
    directory = tmp_path / "mine"
    directory.mkdir(mode=0o700)
    foreign = ["train_notes.txt", "000123.tar", "poetry.lock", "1-2-3-4-5.txt", "1-2-3-4.lock", "1-2-3-4-5-6",
               "a-1-2-3-4", "1-2-3-4-5\n", "ab" * 16 + "-1-2-3-4", "AB" * 16 + "-1-2-3-4-5"]
    for name in foreign:
        (directory / name).write_text("the user's")
    (directory / "cache").mkdir()
    (directory / "7-7-7-7-7").symlink_to(directory / "train_notes.txt")  # a verdict's name, not a file it writes
    ours = ["1-2-10-1-1", "1-3-10-1-1.lock", "1-4-10--5-1", "ab" * 16 + "-1-9-10-1-1"]
    for name in ours:
        (directory / name).write_text("f" * 64)
    for path in directory.iterdir():
        os.utime(path, (time.time() - 40 * DAY,) * 2, follow_symlinks=False)
    (directory / "1-5-10-1-1").write_text("f" * 64)  # a verdict in use
    VerifiedFiles(directory)  # opening the store prunes it
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [*foreign, "cache", "7-7-7-7-7", "1-5-10-1-1", ".pruned"])
    assert (directory / "train_notes.txt").read_text() == "the user's"
