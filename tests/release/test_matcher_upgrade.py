"""After the matcher went from version 1 to 2 (conversation views for chat, preference and trajectory rows), a
release checked by version 1 whose table has no conversation columns is matched by version 2 exactly as before
(``ngrams.SAME_ON_TEXT_TABLES``): merge and redact take its recorded clean check (and carry its allowed reason)
instead of reading every row again. A table with conversation columns, and a check recording no matcher at all (a
datahub from before matcher versions), are read again."""

from __future__ import annotations

import pytest

from datahub.errors import ReleaseError
from datahub.evalset import add_evalset
from datahub.lake import Lake
from datahub.release import create_release, merge_releases, redact
from datahub.sample_id import sample_id_of
from operators.decontam import ngrams
from tests.evalset.helpers import write_evalset
from tests.release.helpers import add_samples
from tests.release.test_merge_evalset_gate import CLEAN, LEAKED, OTHER

GONE = sample_id_of(CLEAN[0])


def _lake(tmp_path, monkeypatch, *, matcher, allow: str | None = None) -> Lake:
    """Eval set ``bench``; release ``parent`` of CLEAN + OTHER (+ LEAKED with ``allow``) checked by ``matcher``."""
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN + OTHER + (LEAKED if allow else []), "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    monkeypatch.setattr(ngrams, "MATCHER_VERSION", matcher)
    create_release(lake, "parent", allow_contamination=allow)
    monkeypatch.undo()
    return lake


def test_a_text_releases_clean_check_by_matcher_1_is_taken_by_redact_and_merge(tmp_path, monkeypatch):
    lake = _lake(tmp_path, monkeypatch, matcher=1)
    child = redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1")
    assert child.details["contamination"].get("reused_check_of") == "parent", child.details["contamination"]
    add_samples(lake, ["a note about the harbour master and the ferry timetable of the islands"], "s3://b/c.jsonl",
                table="other", run_id="job-cccccccccccc")
    create_release(lake, "other", table="other")
    merged = merge_releases(lake, "m", sources=["parent", "other"])
    assert merged.details["contamination"]["releases"]["parent"]["recorded_by"] == "parent"


def test_a_text_releases_allowed_reason_by_matcher_1_carries_over(tmp_path, monkeypatch):
    lake = _lake(tmp_path, monkeypatch, matcher=1, allow="bench is a dev split")
    child = redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1")
    recorded = child.details["contamination"]
    assert (recorded["allowed"], recorded.get("carried_from")) == ("bench is a dev split", "parent"), recorded


def test_a_check_recording_no_matcher_is_not_taken(tmp_path, monkeypatch):
    """Made by a datahub from before matcher versions: which matcher it was is unknown, so the rows are read."""
    lake = _lake(tmp_path, monkeypatch, matcher=None, allow="bench is a dev split")
    with pytest.raises(ReleaseError, match="its check records no matcher version"):
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1")


def test_a_chat_releases_check_by_matcher_1_is_read_again(tmp_path, monkeypatch):
    from tests.release.test_evalset_kinds import leaked_rows

    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    rows = leaked_rows()
    lake.commit("samples", rows, txn="job-aaaaaaaaaaaa", metadata={"datahub.run_id": "job-aaaaaaaaaaaa"})
    monkeypatch.setattr(ngrams, "MATCHER_VERSION", 1)
    create_release(lake, "parent")
    monkeypatch.undo()
    child = redact(lake, "child", source="parent", sample_ids=[rows.column("sample_id")[0].as_py()], reason="PII #1")
    recorded = child.details["contamination"]
    assert "reused_check_of" not in recorded and recorded["checked_rows_of"] == "parent", recorded
