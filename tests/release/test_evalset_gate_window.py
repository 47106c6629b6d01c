"""The eval-set gate's window: an eval set registered after a release's last re-check of the registry and before its
record is committed (while its rows or its lineage are written) was checked by nobody, and the release shipped with
a record naming only the sets it was checked against. Each test registers the set from inside the write at that
exact moment (the write function wrapped): no threads, no timing."""

from __future__ import annotations

import sys

import pytest

import datahub.release.freeze as freeze_module
from datahub.release.freeze import committed_params
from datahub.errors import EvalSetsChangedError, ReleaseError, TransientError
from datahub.evalset import add_evalset
from datahub.lake import Lake
from datahub.release import create_release, get_release, list_releases, merge_releases, redact
from datahub.sample_id import sample_id_of
from tests.evalset.helpers import write_evalset
from tests.release.helpers import add_samples
from tests.release.test_merge_evalset_gate import CLEAN, OTHER

HELDOUT = sample_id_of(OTHER[0])  # overlaps the eval set ``heldout`` registered mid-write
UNRELATED = [("u1", "a question about the orbital period of a comet that no training document here mentions at all",
              "about seventy-six years")]


def _registering_in(monkeypatch, module, lake: Lake, tmp_path, *, items=None, table_prefix: str = "") -> list[str]:
    """Wrap ``module.commit_rows``: the first commit to a table named ``table_prefix...`` registers ``heldout``
    first (another user, at exactly that moment). Returns the tables it was called for."""
    commit_rows = module.commit_rows
    calls: list[str] = []

    def registering(lake_arg, name, *args, **kwargs):
        calls.append(name)
        if name.startswith(table_prefix) and not any(c.startswith(table_prefix) for c in calls[:-1]):
            add_evalset(lake, "heldout", write_evalset(tmp_path / "heldout.jsonl",
                                                         items=items or [("o1", OTHER[0], "harbours")]))
        return commit_rows(lake_arg, name, *args, **kwargs)

    monkeypatch.setattr(module, "commit_rows", registering)
    return calls


def _bench_lake(tmp_path) -> Lake:
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN + OTHER, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    return lake


def test_a_set_registered_while_a_creates_lineage_is_written_refuses_its_record(tmp_path, monkeypatch):
    """Registered after create's last re-check (after its rows were read), while freeze writes the lineage: the
    record is not committed; the same command then checks the rows against it (refused: it overlaps)."""
    lake = _bench_lake(tmp_path)
    calls = _registering_in(monkeypatch, freeze_module, lake, tmp_path, table_prefix="lineage")
    with pytest.raises(EvalSetsChangedError) as refused:
        create_release(lake, "r")
    assert calls == ["lineage"]
    assert isinstance(refused.value, TransientError) and isinstance(refused.value, ReleaseError)
    assert "eval set(s) heldout@1 registered since its rows were checked against [bench@1] only" in str(
        refused.value), refused.value
    assert list_releases(lake) == []
    monkeypatch.undo()
    with pytest.raises(ReleaseError, match=r"overlap eval sets \[heldout@1: 1 sample\(s\)\]"):
        create_release(lake, "r")
    released = create_release(lake, "r", allow_contamination="heldout is a dev split")
    recorded = released.details["contamination"]
    assert (recorded["evalsets"], recorded["contaminated"]) == (["bench@1", "heldout@1"], 1)


def test_a_clean_set_registered_while_a_creates_lineage_is_written_is_checked_by_the_retry(tmp_path, monkeypatch):
    lake = _bench_lake(tmp_path)
    _registering_in(monkeypatch, freeze_module, lake, tmp_path, items=UNRELATED, table_prefix="lineage")
    with pytest.raises(EvalSetsChangedError):
        create_release(lake, "r")
    monkeypatch.undo()
    released = create_release(lake, "r")
    assert released.details["contamination"]["evalsets"] == ["bench@1", "heldout@1"]
    assert released.details["contamination"]["contaminated"] == 0


def _parent_lake(tmp_path) -> Lake:
    lake = _bench_lake(tmp_path)
    create_release(lake, "parent")
    return lake


def test_a_set_registered_while_a_redacts_rows_are_written_refuses_its_record(tmp_path, monkeypatch):
    """Registered after redact's last re-check (before its write pass), while the rows that stay are written."""
    lake = _parent_lake(tmp_path)
    _registering_in(monkeypatch, sys.modules["datahub.release.redact"], lake, tmp_path, table_prefix="release_child")
    with pytest.raises(EvalSetsChangedError, match=r"heldout@1 registered since its rows were checked against "
                                                   r"\[bench@1\] only"):
        redact(lake, "child", source="parent", sample_ids=[sample_id_of(CLEAN[0])], reason="PII #1")
    assert [r.name for r in list_releases(lake)] == ["parent"]
    assert committed_params(lake, "lineage", "child") is None  # refused before the lineage commit, not only the record
    monkeypatch.undo()
    with pytest.raises(ReleaseError, match=r"overlap eval sets \[heldout@1: 1 sample\(s\)\]"):
        redact(lake, "child", source="parent", sample_ids=[sample_id_of(CLEAN[0])], reason="PII #1")


def test_a_set_registered_while_a_redacts_lineage_is_written_refuses_its_record(tmp_path, monkeypatch):
    lake = _parent_lake(tmp_path)
    _registering_in(monkeypatch, freeze_module, lake, tmp_path, table_prefix="lineage")
    with pytest.raises(EvalSetsChangedError):
        redact(lake, "child", source="parent", sample_ids=[sample_id_of(CLEAN[0])], reason="PII #1")
    assert [r.name for r in list_releases(lake)] == ["parent"]


def test_a_set_registered_while_a_merges_rows_are_written_refuses_its_record(tmp_path, monkeypatch):
    lake = _bench_lake(tmp_path)
    add_samples(lake, ["a third corpus document about mountains, rivers and the snow of the long alpine winter"],
                "s3://bucket/c.jsonl", table="other", run_id="job-cccccccccccc")
    create_release(lake, "a")
    create_release(lake, "b", table="other")
    _registering_in(monkeypatch, sys.modules["datahub.release.merge"], lake, tmp_path, table_prefix="release_m")
    with pytest.raises(EvalSetsChangedError, match=r"heldout@1 registered since"):
        merge_releases(lake, "m", sources=["a", "b"])
    assert [r.name for r in list_releases(lake)] == ["a", "b"]
    assert committed_params(lake, "lineage", "m") is None  # refused before the lineage commit, not only the record
    monkeypatch.undo()
    with pytest.raises(ReleaseError, match=r"heldout@1: 1 sample\(s\)"):
        merge_releases(lake, "m", sources=["a", "b"])
    merged = merge_releases(lake, "m", sources=["a", "b"], allow_contamination="heldout is a dev split")
    assert get_release(lake, "m").details["contamination"]["evalsets"] == ["bench@1", "heldout@1"]
    assert merged.details["contamination"]["contaminated"] == 1


def _merge_inputs(tmp_path) -> Lake:
    lake = _bench_lake(tmp_path)
    add_samples(lake, ["a third corpus document about mountains, rivers and the snow of the long alpine winter"],
                "s3://bucket/c.jsonl", table="other", run_id="job-cccccccccccc")
    create_release(lake, "a")
    create_release(lake, "b", table="other")
    return lake


@pytest.mark.parametrize("command, where", [("redact", "release_child"), ("redact", "lineage"), ("merge", "lineage")])
def test_a_clean_set_registered_mid_write_is_checked_by_the_same_command_run_again(tmp_path, monkeypatch, command,
                                                                                    where):
    """As for create above: redact (while its rows or its lineage are written) and merge (its lineage) refuse, and
    the same command run again checks the rows against the new set too and finishes the release."""
    lake = _parent_lake(tmp_path) if command == "redact" else _merge_inputs(tmp_path)
    module = freeze_module if where == "lineage" else sys.modules["datahub.release.redact"]
    _registering_in(monkeypatch, module, lake, tmp_path, items=UNRELATED, table_prefix=where)

    def run():
        if command == "redact":
            return redact(lake, "child", source="parent", sample_ids=[sample_id_of(CLEAN[0])], reason="PII #1")
        return merge_releases(lake, "m", sources=["a", "b"])

    with pytest.raises(EvalSetsChangedError):
        run()
    monkeypatch.undo()
    released = run()
    assert released.details["contamination"]["evalsets"] == ["bench@1", "heldout@1"]
    assert released.details["contamination"].get("allowed") is None
