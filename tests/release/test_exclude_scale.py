"""release create after redactions in bounded memory: the redacted ids looked up a partition at a time, the excluded
rows and their lineage spilled, give the same release as one partition held whole."""

from __future__ import annotations

import shutil

import pytest

from datahub.lake import Lake, external_sort
from datahub.release import create_release, redact
from datahub.release import exclude
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples, release_outcome


def _lake(root) -> Lake:
    """Two redactions (ids, a source file, an id both take down), then more rows of both kinds added."""
    lake = Lake(root)
    add_samples(lake, [f"doc {i} of a" for i in range(40)], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    add_samples(lake, [f"doc {i} of book" for i in range(25)], "book.txt", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "r1")
    redact(lake, "r1-r", source="r1", sample_ids=[sample_id_of(f"doc {i} of a") for i in range(0, 40, 3)],
           reason="PII")
    redact(lake, "r1-rr", source="r1-r", source_uri="book.txt",
           sample_ids=[sample_id_of("doc 4 of a"), sample_id_of("doc 3 of a")], reason="copyright")
    add_samples(lake, [f"doc {i} of b" for i in range(20)] + ["doc 3 of a", "doc 5 of book"], "b.jsonl",
                run_id="job-cccccccccccc")
    add_samples(lake, [f"late doc {i} of book" for i in range(7)], "book.txt", run_id="job-dddddddddddd")
    return lake


@pytest.mark.parametrize("budget", [1, 4])
def test_create_after_redactions_with_tiny_partitions_gives_what_one_partition_gives(tmp_path, monkeypatch, budget):
    one = _lake(tmp_path / "one")
    shutil.copytree(one.root, tmp_path / "many")
    many = Lake(tmp_path / "many")
    first = release_outcome(one, create_release(one, "r2").name)
    monkeypatch.setattr(exclude, "PARTITION_IDS", budget)  # many partitions, each scanning the table
    monkeypatch.setattr(external_sort, "RUN_ROWS", 5)  # the ids, hit rows and drops spilled in many runs
    monkeypatch.setattr(external_sort, "READ_ROWS", 2)
    monkeypatch.setattr(external_sort, "FAN_IN", 3)
    second = release_outcome(many, create_release(many, "r2").name)
    assert second == first
    record, rows, lineage = first
    # 14 ids of a (every third, and 4: "doc 3 of a" twice), the book's 25 + 7 late + 1 by id, 2 rows of "doc 3 of a"
    texts = sorted(r["text"] for r in rows)
    assert "doc 3 of a" not in texts and "doc 5 of book" not in texts and "doc 1 of a" in texts
    assert record["details"]["redacted_excluded"]["by"] == ["r1-r", "r1-rr"]
    assert len(rows) == 40 + 25 + 22 + 7 - record["details"]["redacted_excluded"]["rows"]
    dropped = [r for r in lineage if r["action"] == "dropped"]
    assert [r["sample_id"] for r in dropped] == sorted({r["sample_id"] for r in dropped})
    reasons = {r["sample_id"]: r["reason"] for r in dropped}
    assert reasons[sample_id_of("doc 3 of a")].endswith("(release redact r1-r)")  # its first redaction
    assert reasons[sample_id_of("doc 4 of a")].endswith("(release redact r1-rr)")
    assert reasons[sample_id_of("late doc 2 of book")].endswith("(release redact r1-rr)")  # by its source
