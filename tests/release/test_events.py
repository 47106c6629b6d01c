"""release_events: archive / unarchive as an event history, reads at most once per release per day."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from datahub.errors import ReleaseError
from datahub.release import create_release
from datahub.release.events import EVENTS_TABLE, archive_release, record_read, release_activity
from tests.export.helpers import make_lake


def test_racing_archivers_make_one_event(tmp_path) -> None:
    lake, _ = make_lake(tmp_path / "lake", 5)
    create_release(lake, "r1")
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(archive_release(lake, "r1"))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and True in results  # nobody failed: they all wanted it archived
    assert [(e["event"], e["seq"]) for e in lake.read(EVENTS_TABLE).to_pylist()] == [("archived", 1)]


def test_archive_history_decides_and_releases_stay_untouched(tmp_path) -> None:
    lake, _ = make_lake(tmp_path / "lake", 5)
    create_release(lake, "r1")
    releases_version = lake.version("releases")
    assert release_activity(lake) == {}
    assert archive_release(lake, "r1", reason="superseded by r2") is True
    assert archive_release(lake, "r1") is False  # already archived: no second event
    assert release_activity(lake)["r1"].archived
    assert archive_release(lake, "r1", undo=True) is True
    assert not release_activity(lake)["r1"].archived
    assert archive_release(lake, "r1") is True
    events = lake.read(EVENTS_TABLE).sort_by("seq").to_pylist()
    assert [(e["event"], e["seq"]) for e in events] == [("archived", 1), ("unarchived", 2), ("archived", 3)]
    assert events[0]["detail"] == "superseded by r2"
    assert release_activity(lake)["r1"].archived and lake.version("releases") == releases_version
    with pytest.raises(ReleaseError, match="no release 'r9'"):
        archive_release(lake, "r9")


def test_reads_are_recorded_once_per_day_even_from_many_ranks(tmp_path) -> None:
    lake, _ = make_lake(tmp_path / "lake", 5)
    create_release(lake, "r1")
    results: list[bool] = []
    errors: list[BaseException] = []

    def rank(i: int) -> None:
        try:
            results.append(record_read(lake, "r1", reader=f"rank {i}"))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # racing commits of one day's slot resolve to one event (a racer may see its commit replaced, not doubled)
    assert errors == [] and True in results
    reads = lake.read(EVENTS_TABLE).to_pylist()
    assert len(reads) == 1 and reads[0]["event"] == "read" and reads[0]["detail"].startswith("rank ")
    assert record_read(lake, "r1") is False  # later the same day: already recorded

    yesterday = datetime.now(timezone.utc) - timedelta(days=1)
    assert record_read(lake, "r1", at=yesterday) is True  # replayed from a log: another day, another event
    assert release_activity(lake)["r1"].last_read == reads[0]["ts"]  # the latest read wins
    with pytest.raises(ReleaseError, match="no release 'nope'"):
        record_read(lake, "nope")
