"""A release command killed between its commits (materialized table / lineage, then the ``releases`` row) and run
again: the re-run finishes exactly what the first try committed, or is refused naming what differs and the fix
(the first try's commits are skipped as applied, so a re-run with other arguments or data recorded other rows
than the committed ones)."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from datahub.errors import ReleaseError
from datahub.lake import Lake
from datahub.release import create_release, merge_releases
from datahub.release.records import read_release
from datahub.release.redact import redact
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples


class Killed(Exception):
    pass


@pytest.fixture
def kill_before_record(monkeypatch):
    """Calls the function with the ``releases`` commit failing (killed before the release row), then restores."""
    def run(function, *args, **kwargs):
        original = Lake.commit

        def commit(self, name, *a, **k):
            if name == "releases":
                raise Killed("killed before the releases row")
            return original(self, name, *a, **k)

        with monkeypatch.context() as patch:
            patch.setattr(Lake, "commit", commit)
            with pytest.raises(Killed):
                function(*args, **kwargs)
    return run


def _released(lake: Lake, name: str) -> list[str]:
    lineage = lake.read("lineage")
    rows = lineage.filter(pc.and_(pc.equal(lineage.column("action"), "released"),
                                  pc.equal(lineage.column("ref"), name)))
    return sorted(rows.column("sample_id").to_pylist())


def test_create_rerun_finishes_the_first_tries_version(tmp_path, kill_before_record):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["one doc", "two doc"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    first = int(lake.table("samples").version())
    kill_before_record(create_release, lake, "r1")
    add_samples(lake, ["three doc"], "a.jsonl", run_id="job-bbbbbbbbbbbb")  # the next pipeline run lands meanwhile
    with pytest.raises(ReleaseError, match=r"'r1' was half-created .*version=%d.*this run has version=%d.*"
                                           r"first try's --version" % (first, first + 1)):
        create_release(lake, "r1", version=first + 1)
    release = create_release(lake, "r1")  # the documented repair: the same command again
    assert (release.version, release.row_count) == (first, 2)
    held = read_release(lake, release, columns=["sample_id"]).column("sample_id").to_pylist()
    assert _released(lake, "r1") == sorted(held)


def test_create_rerun_with_redactions_finishes_the_first_tries_version(tmp_path, kill_before_record):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["doc a", "doc b", "doc c"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r0")
    redact(lake, "r0b", source="r0", reason="takedown #1", sample_ids=[sample_id_of("doc a")])
    first = int(lake.table("samples").version())
    kill_before_record(create_release, lake, "r1")  # release_r1 materialized without doc a, lineage committed
    add_samples(lake, ["doc d"], "a.jsonl", run_id="job-bbbbbbbbbbbb")
    release = create_release(lake, "r1")
    assert release.details["from_version"] == first and release.row_count == 2
    held = read_release(lake, release, columns=["sample_id"]).column("sample_id").to_pylist()
    assert sorted(held) == sorted([sample_id_of("doc b"), sample_id_of("doc c")]) == _released(lake, "r1")


def _two_releases(lake: Lake) -> None:
    add_samples(lake, [f"a{i}" for i in range(8)], "a.jsonl", table="ta", run_id="job-aaaaaaaaaaaa")
    add_samples(lake, [f"b{i}" for i in range(8)], "b.jsonl", table="tb", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "A", table="ta")
    create_release(lake, "B", table="tb")


def test_merge_rerun_with_other_weights_is_refused_the_same_finishes(tmp_path, kill_before_record):
    lake = Lake(tmp_path / "lake")
    _two_releases(lake)
    kill_before_record(merge_releases, lake, "M", sources=["A", "B"], weights={"A": 0.5, "B": 0.5})
    with pytest.raises(ReleaseError, match=r"'M' was half-created .*weights=.*0\.5.*this run has weights=.*1\.0.*"
                                           r"--weights"):
        merge_releases(lake, "M", sources=["A", "B"], weights={"A": 1, "B": 0})
    with pytest.raises(ReleaseError, match="seed=0.*this run has seed=2"):
        merge_releases(lake, "M", sources=["A", "B"], weights={"A": 0.5, "B": 0.5}, seed=2)
    merged = merge_releases(lake, "M", sources=["A", "B"], weights={"A": 0.5, "B": 0.5})
    sources = read_release(lake, merged, columns=["release_source"]).column("release_source").to_pylist()
    assert {s: sources.count(s) for s in ("A", "B")} == merged.details["quotas"] == {"A": 8, "B": 8}


def test_redact_rerun_with_more_ids_is_refused_the_same_finishes(tmp_path, kill_before_record):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["doc a", "doc b", "doc c"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    a, b = sample_id_of("doc a"), sample_id_of("doc b")
    kill_before_record(redact, lake, "r2", source="r1", reason="takedown #1", sample_ids=[a])
    with pytest.raises(ReleaseError, match=r"'r2' was half-created .*sample_ids=\"1 ids.*this run has "
                                           r"sample_ids=\"2 ids.*choose a new release name"):
        redact(lake, "r2", source="r1", reason="takedown #1", sample_ids=[a, b])
    redacted = redact(lake, "r2", source="r1", reason="takedown #1", sample_ids=[a])
    held = read_release(lake, redacted, columns=["sample_id"]).column("sample_id").to_pylist()
    assert a not in held and redacted.details["removed"] == 1 and sorted(held) == _released(lake, "r2")
    # the grown take-down goes out as a new release of the half-created one's successor
    again = redact(lake, "r3", source="r2", reason="takedown #1", sample_ids=[b])
    assert b not in read_release(lake, again, columns=["sample_id"]).column("sample_id").to_pylist()
