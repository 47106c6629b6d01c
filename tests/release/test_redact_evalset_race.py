"""An eval set registered while a ``release redact`` runs is checked, never let out under the parent's reason nor
behind its clean check: redact decided reuse and carry-over from the eval sets registered when it started, and its
check (or none, when it took the parent's clean check) read the eval sets registered later. Each test registers the
set from the progress callback (or just before the check's index is built), so the interleaving is the same on every
run: no threads, no timing."""

from __future__ import annotations

import sys

import pytest

import datahub.evalset.check as check_module
from datahub.errors import EvalSetsChangedError, ReleaseError, TransientError
from datahub.evalset import add_evalset
from datahub.lake import Lake
from datahub.release import create_release, get_release, list_releases, merge_releases, redact
from datahub.release.evalset_gate import allowed_of, same_basis
from datahub.sample_id import sample_id_of
from operators.decontam import ngrams
from tests.evalset.helpers import write_evalset
from tests.release.helpers import add_samples
from tests.release.test_merge_evalset_gate import CLEAN, LEAKED, OTHER

GONE = sample_id_of(CLEAN[0])
HELDOUT = sample_id_of(OTHER[0])  # overlaps the eval set ``heldout`` registered mid-run


def _lake(tmp_path, *, allow: str | None) -> Lake:
    """Eval set ``bench``; release ``parent`` of CLEAN + OTHER (+ LEAKED, let out with ``allow``)."""
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN + OTHER + (LEAKED if allow else []), "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "parent", allow_contamination=allow)
    return lake


def _register_heldout(lake: Lake, tmp_path) -> None:
    add_evalset(lake, "heldout", write_evalset(tmp_path / "heldout.jsonl", items=[("o1", OTHER[0], "harbours")]))


def _registering_at(lake: Lake, tmp_path, stage: str):
    """A progress callback that registers ``heldout`` the first time ``stage`` reports (another user, mid-run)."""
    done: list[bool] = []

    def progress(name: str, rows: int, total: int | None) -> None:
        if name == stage and not done:
            done.append(True)
            _register_heldout(lake, tmp_path)
    return progress


def test_a_set_registered_while_the_rows_to_remove_are_found_is_not_let_out_under_the_parents_reason(tmp_path):
    lake = _lake(tmp_path, allow="bench is a dev split")
    with pytest.raises(ReleaseError) as refused:
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1",
               progress=_registering_at(lake, tmp_path, "find the rows to remove"))
    message = str(refused.value)
    assert "heldout@1: 1 sample(s)" in message and HELDOUT in message, message
    assert ("release 'parent' was released with --allow-contamination \"bench is a dev split\" against [bench@1]; "
            "that reason does not carry over: it was checked against eval sets [bench@1], registered now: "
            "[bench@1, heldout@1]") in message, message
    assert [r.name for r in list_releases(lake)] == ["parent"] and not lake.exists("release_child")


def test_a_set_registered_just_before_the_checks_index_is_built_is_not_let_out_under_the_parents_reason(
        tmp_path, monkeypatch):
    """The carry-over was decided from the sets registered when the gate began; the check read one more: the
    parent's reason does not cover what it read, so the redact is refused."""
    lake = _lake(tmp_path, allow="bench is a dev split")
    load_index = check_module.load_index

    def registered_first(*args, **kwargs):
        if not lake.exists("evalsets") or "heldout" not in lake.read("evalsets", columns=["evalset"]).column(
                "evalset").to_pylist():
            _register_heldout(lake, tmp_path)
        return load_index(*args, **kwargs)

    monkeypatch.setattr(check_module, "load_index", registered_first)
    with pytest.raises(ReleaseError, match="that reason does not carry over: it was checked against eval sets "
                                           r"\[bench@1\], registered now: \[bench@1, heldout@1\]"):
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1")
    assert [r.name for r in list_releases(lake)] == ["parent"] and not lake.exists("release_child")
    monkeypatch.undo()
    released = redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1",
                      allow_contamination="both are dev splits")
    recorded = released.details["contamination"]
    assert (recorded["evalsets"], recorded["contaminated"], recorded["allowed"]) == (
        ["bench@1", "heldout@1"], 3, "both are dev splits")
    assert "carried_from" not in recorded


def test_a_set_registered_while_the_rows_to_remove_are_found_is_checked_not_covered_by_the_parents_clean_check(
        tmp_path):
    lake = _lake(tmp_path, allow=None)
    stages: list[str] = []
    register = _registering_at(lake, tmp_path, "find the rows to remove")

    def progress(name: str, rows: int, total: int | None) -> None:
        stages.append(name)
        register(name, rows, total)

    with pytest.raises(ReleaseError, match=r"overlap eval sets \[heldout@1: 1 sample\(s\)\]"):
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1", progress=progress)
    assert "eval-set check" in stages and not lake.exists("release_child")


def test_a_set_registered_while_the_kept_rows_are_checked_refuses_before_anything_is_written(tmp_path):
    """The check's index was built before the set was registered: the check did not read it, so the redact is
    refused before its rows are written, and the same command (or one taking the overlap down too) checks it."""
    lake = _lake(tmp_path, allow="bench is a dev split")
    with pytest.raises(ReleaseError) as refused:
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1",
               progress=_registering_at(lake, tmp_path, "eval-set check"))
    assert str(refused.value).startswith(
        "release 'child' refused: eval set(s) heldout@1 registered since its rows were checked against [bench@1] "
        "only. Nothing was written: run the same command again"), refused.value
    assert [r.name for r in list_releases(lake)] == ["parent"] and not lake.exists("release_child")
    with pytest.raises(ReleaseError, match=r"heldout@1: 1 sample\(s\)"):
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1")
    child = redact(lake, "child", source="parent", sample_ids=[GONE, HELDOUT], reason="PII #1",
                   allow_contamination="bench is a dev split")
    recorded = child.details["contamination"]
    assert (recorded["evalsets"], recorded["contaminated"], child.row_count) == (["bench@1", "heldout@1"], 2, 7)


def test_same_basis_compares_each_check_not_their_union():
    """A merge's inputs checked against {bench} and {bench, heldout}: not both checked against {bench, heldout}."""
    bench, heldout = {"bench@1": "a" * 64}, {"heldout@1": "b" * 64}
    both = {**bench, **heldout}

    def check(digests):
        return {"evalset_digests": digests, "ngram": ngrams.DEFAULT_NGRAM, "matcher": ngrams.MATCHER_VERSION}

    assert same_basis([check(both), check(both)], both)
    assert not same_basis([check(bench), check(both)], both)


def test_a_release_allowed_before_the_matcher_was_recorded_is_refused_naming_its_reason_and_the_fix(
        tmp_path, monkeypatch):
    """A release let out with --allow-contamination by a datahub that recorded no matcher version: a take-down from
    it is refused (the matcher may have changed since), and the refusal says the parent's reason, why it did not
    carry over and how to give it again; given again, the redact goes through."""
    monkeypatch.setattr(ngrams, "MATCHER_VERSION", None)  # what such a datahub recorded: no matcher
    lake = _lake(tmp_path, allow="dev split")
    monkeypatch.undo()
    parent = get_release(lake, "parent")
    assert parent.details["contamination"].get("matcher") is None and allowed_of(parent, {"x": "y"}) is None
    with pytest.raises(ReleaseError) as refused:
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1")
    message = str(refused.value)
    assert ("release 'parent' was released with --allow-contamination \"dev split\" against [bench@1]; that reason "
            "does not carry over: its check records no matcher version") in message, message
    assert 'if it still holds for these samples, give it again: --allow-contamination "dev split"' in message
    child = redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1", allow_contamination="dev split")
    assert (child.details["contamination"]["allowed"], child.details["contamination"]["contaminated"]) == (
        "dev split", 2)


def test_a_refused_redact_does_not_read_every_release_first(tmp_path, monkeypatch):
    """The gate needs only the rows the redact keeps: it refuses before ``releases_containing`` reads the ids of every
    release in the lake (minutes on a big lake), not after."""
    redact_module = sys.modules["datahub.release.redact"]

    lake = _lake(tmp_path, allow=None)
    _register_heldout(lake, tmp_path)
    scanned: list[str] = []
    releases_containing = redact_module.releases_containing

    def recorded(*args, **kwargs):
        scanned.append("releases")
        return releases_containing(*args, **kwargs)

    monkeypatch.setattr(redact_module, "releases_containing", recorded)
    with pytest.raises(ReleaseError, match=r"overlap eval sets \[heldout@1: 1 sample\(s\)\]"):
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1")
    assert scanned == []
    child = redact(lake, "child", source="parent", sample_ids=[GONE, HELDOUT], reason="PII #1")
    assert scanned == ["releases"] and child.details["contained_in"] == {"parent": 2}


def test_a_set_registered_while_every_release_is_read_refuses_before_the_rows_are_written(tmp_path, monkeypatch):
    """The parent's clean check covered the child when the gate ran; a set registered while ``releases_containing``
    read the lake was checked by nobody: refused before anything is written."""
    redact_module = sys.modules["datahub.release.redact"]

    lake = _lake(tmp_path, allow=None)
    releases_containing = redact_module.releases_containing

    def registering(*args, **kwargs):
        found = releases_containing(*args, **kwargs)
        _register_heldout(lake, tmp_path)
        return found

    monkeypatch.setattr(redact_module, "releases_containing", registering)
    with pytest.raises(EvalSetsChangedError, match=r"heldout@1 registered since its rows were checked against \[bench@1\]"):
        redact(lake, "child", source="parent", sample_ids=[GONE], reason="PII #1")
    assert [r.name for r in list_releases(lake)] == ["parent"] and not lake.exists("release_child")


def test_a_set_registered_while_a_merges_inputs_are_checked_refuses_the_merge_before_anything_is_written(tmp_path):
    """``release merge``: input ``c`` takes its recorded clean check (against bench), input ``old`` is read against
    the index built before ``heldout`` was registered: neither was checked against it, so the merge is refused."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "old", table="other")  # no eval set yet: unchecked, read by the merge
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "c")
    with pytest.raises(EvalSetsChangedError) as refused:  # a TransientError: retry_policy runs it again
        merge_releases(lake, "m", sources=["c", "old"], progress=_registering_at(lake, tmp_path, "eval-set check"))
    assert str(refused.value).startswith(
        "release 'm' refused: eval set(s) heldout@1 registered while the inputs were checked: the rows of c, old were "
        "not checked against them"), refused.value
    assert [r.name for r in list_releases(lake)] == ["old", "c"] and not lake.exists("release_m")
    with pytest.raises(ReleaseError, match=r"--from release 'old': 1 sample\(s\) of other v\d+ overlap eval sets "
                                           r"\[heldout@1: 1 sample\(s\)\]"):
        merge_releases(lake, "m", sources=["c", "old"])


def test_a_set_registered_while_a_create_reads_its_rows_refuses_it_before_anything_is_written(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN + OTHER, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    with pytest.raises(EvalSetsChangedError) as refused:
        create_release(lake, "r", progress=_registering_at(lake, tmp_path, "eval-set check"))
    assert isinstance(refused.value, TransientError) and isinstance(refused.value, ReleaseError)
    assert str(refused.value).startswith(
        "release 'r' refused: the eval sets registered now (bench@1, heldout@1) are not those samples v1 was checked "
        "against (bench@1): one was registered while its rows were checked"), refused.value
    assert list_releases(lake) == []
    with pytest.raises(ReleaseError, match=r"overlap eval sets \[heldout@1: 1 sample\(s\)\]"):
        create_release(lake, "r")
