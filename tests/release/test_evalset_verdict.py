"""``evalset_verdict`` / ``describe_verdict`` (``release show``, ``--json``'s ``evalset_check``) say what the record
holds: a redact made before redacts were gated is not described as made with no eval set registered; a merge that
read one input and took another's recorded check does not say its rows were not read; and every verdict has the same
keys."""

from __future__ import annotations

import dataclasses

from datahub.evalset import add_evalset
from datahub.lake import Lake
from datahub.release import create_release, merge_releases, redact
from datahub.release.evalset_gate import describe_verdict, evalset_verdict
from datahub.sample_id import sample_id_of
from tests.evalset.helpers import write_evalset
from tests.release.helpers import add_samples
from tests.release.test_merge_evalset_gate import CLEAN, LEAKED, OTHER


def test_a_redact_from_before_redacts_were_gated_is_not_described_as_made_with_no_eval_set(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "plain")
    now = redact(lake, "plain-r", source="plain", sample_ids=[sample_id_of(CLEAN[0])], reason="PII #1")
    assert describe_verdict(evalset_verdict(now), now.name).startswith(
        "not checked (no eval set registered when it was made); check now: datahub evalset check --release plain-r")
    # what a redact made before the gate holds: no check, and nothing saying there was nothing to check against
    old = dataclasses.replace(now, details={k: v for k, v in now.details.items() if k != "evalset_gate"})
    verdict = evalset_verdict(old)
    assert verdict["verdict"] == "not_checked"
    assert describe_verdict(verdict, old.name) == (
        "not checked (made before redacts were gated: the rows it kept were never checked, whatever was registered "
        "then); check now: datahub evalset check --release plain-r")


def test_a_merge_that_read_one_input_and_took_anothers_check_names_which(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    unchecked = create_release(lake, "old", table="other")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "c")
    merged = merge_releases(lake, "m", sources=["c", "old"])
    verdict = evalset_verdict(merged)
    assert (verdict["read"], verdict["reused"]) == (["old"], {"c": "c"})
    assert describe_verdict(verdict, "m") == (
        "clean: 7 rows share no n-gram with bench@1 (rows of old read; c: the check recorded by c, not read again)")
    again = merge_releases(lake, "m2", sources=["c"])
    assert describe_verdict(evalset_verdict(again), "m2") == (
        "clean: 4 rows share no n-gram with bench@1 (the check recorded by c: rows not read again)")
    # every verdict has the same keys
    add_samples(lake, LEAKED, "s3://bucket/c.jsonl", run_id="job-cccccccccccc")
    allowed = create_release(lake, "leaky", allow_contamination="dev split")
    shapes = {v["verdict"]: sorted(v) for v in map(evalset_verdict, [unchecked, merged, allowed])}
    assert set(shapes) == {"not_checked", "clean", "allowed"}
    assert shapes["not_checked"] == shapes["clean"] == shapes["allowed"] == sorted([
        "verdict", "evalsets", "contaminated", "by_evalset", "rows_checked", "allowed", "reused", "read",
        "carried_from", "why_not_checked"])
    assert evalset_verdict(unchecked)["why_not_checked"] == "no eval set registered when it was made"
    assert (evalset_verdict(allowed)["carried_from"], evalset_verdict(allowed)["read"]) == (None, ["leaky"])
