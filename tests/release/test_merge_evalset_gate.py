"""``release merge`` runs the eval-set gate of ``release create`` on each --from release: eval sets registered after
an input release was created made a merge that leaked them (exit 0; ``evalset check --release`` found them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.compute as pc
import pytest

from datahub.errors import ReleaseError
from datahub.evalset import add_evalset, list_evalsets
from datahub.lake import Lake
from datahub.release import create_release, get_release, list_releases, merge_releases
from datahub.sample_id import sample_id_of
from tests.evalset.helpers import QUESTIONS, item_text, write_evalset
from tests.release.helpers import add_samples
from tests.release.test_crash_rerun import kill_before_record  # noqa: F401  (fixture)

CLEAN = [f"an ordinary training document number {i} about gardening, tools, soil and the weather in spring" for i in range(4)]
LEAKED = ["Forum post: " + item_text("q2").upper() + " thanks!", "Quiz answers. " + item_text("q3")]
OTHER = [f"a second corpus document number {i} about harbours, ships and the tides of the northern sea" for i in range(3)]


def _lake(tmp_path) -> Lake:
    """Releases ``clean`` and ``leaky`` created before the eval set ``bench`` was registered (so create let them
    through), then ``bench`` added."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "clean", table="other")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    return lake


def test_a_merge_of_a_contaminated_release_is_refused_before_anything_is_written(tmp_path):
    lake = _lake(tmp_path)
    leaked_ids = sorted(sample_id_of(t) for t in LEAKED)
    with pytest.raises(ReleaseError) as refused:
        merge_releases(lake, "mix", sources=["clean", "leaky"])
    message = str(refused.value)
    version = get_release(lake, "leaky").version
    assert message.startswith(f"release 'mix' refused: --from release 'leaky': 2 sample(s) of samples v{version} "
                              "overlap eval sets [bench@1: 2 sample(s)]"), message
    assert all(sample_id in message for sample_id in leaked_ids), message
    assert "clean" not in message.split("\n")[0].replace("'leaky'", "")  # only the contaminated input is named
    assert '--allow-contamination "REASON"' in message
    assert [r.name for r in list_releases(lake)] == ["clean", "leaky"]
    assert not lake.exists("release_mix")


def test_allowed_contamination_of_a_merge_is_recorded_as_create_records_it(tmp_path):
    lake = _lake(tmp_path)
    with pytest.raises(ReleaseError, match="needs a reason"):
        merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="  ")
    release = merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="bench is a public dev split")
    assert release.row_count == 9
    recorded = get_release(lake, "mix").details["contamination"]
    assert recorded["allowed"] == "bench is a public dev split"
    assert recorded["by_evalset"] == {"bench@1": 2} and recorded["contaminated"] == 2
    assert recorded["evalsets"] == ["bench@1"] and recorded["rows_checked"] == 9
    assert {name: c["contaminated"] for name, c in recorded["releases"].items()} == {"clean": 0, "leaky": 2}


def test_a_clean_merge_records_the_check(tmp_path):
    lake = _lake(tmp_path)
    release = merge_releases(lake, "mix", sources=["clean"])
    recorded = release.details["contamination"]
    assert recorded["allowed"] is None and recorded["contaminated"] == 0 and recorded["rows_checked"] == 3


def test_cli_merge_refuses_then_allows_and_redact_help_says_it_is_gated(tmp_path):
    lake = _lake(tmp_path)

    def datahub(*args):
        return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], capture_output=True, text=True)

    refused = datahub("release", "merge", "mix", "--from", "clean", "--from", "leaky", "--lake", lake.root)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    err = " ".join(refused.stderr.split())
    assert "--from release 'leaky'" in err and "bench@1: 2 sample(s)" in err, err
    assert sample_id_of(LEAKED[0]) in err and "--allow-contamination" in err, err
    assert [r.name for r in list_releases(lake)] == ["clean", "leaky"]
    allowed = datahub("release", "merge", "mix", "--from", "clean", "--from", "leaky", "--lake", lake.root,
                      "--allow-contamination", "held-out split", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["details"]["contamination"]["allowed"] == "held-out split"
    helped = datahub("release", "redact", "--help")
    assert helped.returncode == 0
    assert "Refused, as release create is, when the samples that stay overlap an eval set" in " ".join(
        helped.stdout.split()), helped.stdout


def test_a_merge_killed_before_its_record_finishes_with_allow_contamination_once_an_eval_set_is_added(
        tmp_path, kill_before_record):
    """Killed after its table and lineage commits, then an eval set overlapping an input is registered: the gate now
    refuses the re-run without --allow-contamination, and with it the re-run finishes the first try's commits (the
    flag changes no row, so it is not compared with the first try's arguments)."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "clean", table="other")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky")
    kill_before_record(merge_releases, lake, "mix", sources=["clean", "leaky"])
    assert lake.exists("release_mix") and "mix" not in [r.name for r in list_releases(lake)]
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    with pytest.raises(ReleaseError, match="overlap eval sets"):
        merge_releases(lake, "mix", sources=["clean", "leaky"])
    release = merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="found after the merge")
    assert release.row_count == 9
    assert get_release(lake, "mix").details["contamination"]["allowed"] == "found after the merge"


def _released_reasons(lake: Lake, name: str) -> dict[str, str | None]:
    lineage = lake.read("lineage")
    rows = lineage.filter(pc.and_(pc.equal(lineage.column("action"), "released"),
                                  pc.equal(lineage.column("ref"), name)))
    return dict(zip(rows.column("sample_id").to_pylist(), rows.column("reason").to_pylist()))


def test_an_allowed_contamination_of_a_merge_is_in_the_samples_lineage_as_create_writes_it(tmp_path):
    """create writes 'contamination allowed: REASON (evalset@version:item)' into a contaminated sample's released
    reason; a merge wrote only 'merged_from:INPUT', so `datahub lineage SAMPLE` did not say it went out anyway."""
    lake = _lake(tmp_path)
    merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="bench is a public dev split")
    reasons = _released_reasons(lake, "mix")
    assert len(reasons) == 9
    assert reasons[sample_id_of(LEAKED[0])] == ("merged_from:leaky; contamination allowed: bench is a public dev split "
                                                "(bench@1:q2)")
    assert reasons[sample_id_of(LEAKED[1])] == ("merged_from:leaky; contamination allowed: bench is a public dev split "
                                                "(bench@1:q3)")
    assert {reasons[sample_id_of(t)] for t in CLEAN} == {"merged_from:leaky"}
    assert {reasons[sample_id_of(t)] for t in OTHER} == {"merged_from:clean"}
    shown = subprocess.run([sys.executable, "-m", "datahub.cli.main", "lineage", sample_id_of(LEAKED[1]),
                            "--lake", lake.root, "--json"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    events = json.loads(shown.stdout)["events"]
    assert [e["reason"] for e in events if e["action"] == "released" and e["ref"] == "mix"] == [
        "merged_from:leaky; contamination allowed: bench is a public dev split (bench@1:q3)"]


def test_the_contaminated_ids_of_a_merge_stream_through_spilled_runs(tmp_path, monkeypatch):
    """The gate holds a few examples, not every contaminated id: the ids go through sorted runs on local disk (one
    row a run here) and still reach the lineage and the counts."""
    import datahub.evalset.check as check
    from datahub.lake import external_sort

    monkeypatch.setattr(external_sort, "RUN_ROWS", 1)
    lake = _lake(tmp_path)
    leaky = get_release(lake, "leaky")
    found = check.contamination(lake, table=leaky.table, version=leaky.version, hits=lambda hits: None, batch_rows=2,
                                examples=1)
    assert found.count == 2 and len(found.refs) == 1 and found.by_evalset == {"bench@1": 2}
    release = merge_releases(lake, "mix", sources=["leaky", "clean"], allow_contamination="dev split")
    assert release.details["contamination"]["contaminated"] == 2
    reasons = _released_reasons(lake, "mix")
    assert sorted(r for r in reasons.values() if "contamination" in (r or "")) == [
        "merged_from:leaky; contamination allowed: dev split (bench@1:q2)",
        "merged_from:leaky; contamination allowed: dev split (bench@1:q3)"]


def test_a_merge_reuses_a_recorded_clean_check_of_the_same_version_and_eval_sets(tmp_path):
    """An input release made (create) or merged after the eval sets were registered was checked at that table
    version: the merge gate takes that check instead of reading the input's text again, and scans again once the
    registered eval-set versions differ."""
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "clean", table="other")  # checked against bench@1 at other v0
    add_samples(lake, CLEAN, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "plain")
    scanned: list[tuple[int, int]] = []

    def progress(stage, done, total):
        if stage == "eval-set check":
            scanned.append((done, total))

    first = merge_releases(lake, "mix", sources=["clean", "plain"], progress=progress)
    assert scanned == []  # both inputs' checks were recorded by their creates: no text read
    checks = first.details["contamination"]["releases"]
    assert {n: c["recorded_by"] for n, c in checks.items()} == {"clean": "clean", "plain": "plain"}
    assert first.details["contamination"]["rows_checked"] == 7 and first.details["contamination"]["contaminated"] == 0
    # a merge's own table was never checked as such: read; the checks a merge recorded of its inputs count too
    second = merge_releases(lake, "mix2", sources=["mix", "clean"], progress=progress)
    assert scanned and scanned[-1] == (7, 7)  # 'mix' (release_mix, 7 rows) read, 'clean' not
    assert second.details["contamination"]["releases"]["clean"]["recorded_by"] == "clean"
    assert "recorded_by" not in second.details["contamination"]["releases"]["mix"]
    scanned.clear()
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench2.jsonl", items=[("z9", "an entirely new question "
                "about the melting point of gallium in a warm human hand", "about 29.8 degrees Celsius")]))
    again = merge_releases(lake, "mix3", sources=["clean", "plain"], progress=progress)
    assert scanned[-1] == (7, 7)  # bench@2 now: both inputs read again
    assert again.details["contamination"]["evalsets"] == ["bench@2"]
    assert all("recorded_by" not in c for c in again.details["contamination"]["releases"].values())


def test_a_merge_finished_with_allow_contamination_after_its_lineage_commit_notes_it_in_the_lineage(
        tmp_path, kill_before_record):
    """Killed after its lineage commit (no contamination then), finished with --allow-contamination once an eval set
    overlaps an input: the committed released rows cannot change, so the allowed reason of each contaminated sample
    goes into the lineage in a commit of its own (once: a further re-run with another reason is refused)."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "clean", table="other")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky")
    kill_before_record(merge_releases, lake, "mix", sources=["clean", "leaky"])
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    kill_before_record(merge_releases, lake, "mix", sources=["clean", "leaky"], allow_contamination="found late")
    with pytest.raises(ReleaseError, match="(?s)allow_contamination=\"found late\".*this run has allow_contamination="
                                           "\"another reason\""):
        merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="another reason")
    release = merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="found late")
    assert release.details["contamination"]["allowed"] == "found late"
    rows, noted = _released_rows_and_notes(lake, "mix")
    late = "merged_from:leaky; contamination allowed: found late"
    assert noted == sorted([(sample_id_of(LEAKED[0]), f"{late} (bench@1:q2)"),
                            (sample_id_of(LEAKED[1]), f"{late} (bench@1:q3)")])
    assert rows.num_rows == 9 + 2  # every released row of the first try, and one noted row per contaminated sample


def test_a_recorded_check_is_not_reused_once_an_eval_set_of_the_same_version_holds_other_items(tmp_path):
    """The evalsets table made again (deleted by hand, the set added anew): 'bench@1' names other items now, so the
    check recorded against the old bench@1 (its content digest) is not taken."""
    import shutil

    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "plain", allow_contamination="dev split")  # contaminated: never reused
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "clean", table="other")
    scanned: list[int] = []

    def progress(stage, done, total):
        if stage == "eval-set check":
            scanned.append(done)

    merge_releases(lake, "mix", sources=["clean"], progress=progress)
    assert scanned == []
    shutil.rmtree(lake.table_uri("evalsets"))
    add_evalset(lake, "bench", write_evalset(tmp_path / "other.jsonl", items=[(
        "z1", "a question about harbours, ships and the tides of the northern sea in a second corpus", "tides")]))
    assert [f"{s.name}@{s.version}" for s in list_evalsets(lake)] == ["bench@1"]
    again = merge_releases(lake, "mix2", sources=["clean"], progress=progress)
    assert scanned[-1] == 3 and "recorded_by" not in again.details["contamination"]["releases"]["clean"]
    merged = merge_releases(lake, "mix3", sources=["plain"], allow_contamination="dev split", progress=progress)
    assert scanned[-1] == 6 and merged.details["contamination"]["contaminated"] == 0  # 'plain' read again


def test_a_contaminated_check_recorded_with_allow_contamination_is_never_reused(tmp_path):
    """A create that found contamination and was allowed recorded its check: a merge of that release without
    --allow-contamination must scan it again and refuse, not take the recorded check (only clean checks count)."""
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "plain", allow_contamination="dev split")
    assert get_release(lake, "plain").details["contamination"]["contaminated"] == 2
    with pytest.raises(ReleaseError, match="'plain': 2 sample\\(s\\) .* overlap eval sets"):
        merge_releases(lake, "mix", sources=["plain"])


def test_a_clean_check_of_a_recreated_samples_table_at_the_same_version_and_row_count_is_not_reused(tmp_path):
    """The samples table made again restarts its versions: a clean check of the old table at the same version and
    row count is not taken for the new rows (the digest of sample ids differs), so the new table's overlap refuses."""
    import shutil

    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    old = create_release(lake, "old")
    shutil.rmtree(lake.table_uri("samples"))  # made again: same versions, same row count, other rows
    add_samples(lake, CLEAN[:2] + LEAKED, "s3://bucket/a.jsonl", run_id="job-cccccccccccc")
    new = create_release(lake, "new", allow_contamination="dev split")
    assert (new.table, new.version, new.row_count) == (old.table, old.version, old.row_count)
    with pytest.raises(ReleaseError, match="'new': 2 sample\\(s\\) .* overlap eval sets"):
        merge_releases(lake, "mix", sources=["new"])


def test_a_merge_re_run_notes_the_samples_an_eval_set_overlaps_only_since_its_earlier_try(tmp_path, kill_before_record):
    """As create: killed after its lineage and bench@1's notes (q3), re-run with the same reason once bench@2 also
    holds q2: the sample overlapping q2 gets a note too (notes are written once per check of the inputs)."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky")
    kill_before_record(merge_releases, lake, "mix", sources=["leaky"])
    add_evalset(lake, "bench", write_evalset(tmp_path / "b1.jsonl", items=[q for q in QUESTIONS if q[0] == "q3"]))
    kill_before_record(merge_releases, lake, "mix", sources=["leaky"], allow_contamination="R")
    add_evalset(lake, "bench", write_evalset(tmp_path / "b2.jsonl"))
    release = merge_releases(lake, "mix", sources=["leaky"], allow_contamination="R")
    assert release.details["contamination"]["by_evalset"] == {"bench@2": 2}
    rows, noted = _released_rows_and_notes(lake, "mix")
    late = "merged_from:leaky; contamination allowed: R"
    assert noted == sorted([(sample_id_of(LEAKED[1]), f"{late} (bench@1:q3)"),
                            (sample_id_of(LEAKED[0]), f"{late} (bench@2:q2)"),
                            (sample_id_of(LEAKED[1]), f"{late} (bench@2:q3)")])


def test_a_re_run_with_another_reason_is_refused_before_any_pass_over_the_rows(tmp_path, kill_before_record):
    """A merge (or create) whose first try's lineage gives 'contamination allowed: R' is refused for another reason or
    none before the eval-set check and the dedup pass read a row (before, only freeze refused, after both)."""
    lake = _lake(tmp_path)
    kill_before_record(merge_releases, lake, "mix", sources=["clean", "leaky"], allow_contamination="R")
    kill_before_record(create_release, lake, "r1", table="samples", allow_contamination="R")
    stages: list[str] = []

    def progress(stage, done, total):
        stages.append(stage)

    for reason in ("other", None):
        with pytest.raises(ReleaseError, match="this run has allow_contamination="):
            merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination=reason, progress=progress)
        with pytest.raises(ReleaseError, match="this run has allow_contamination="):
            create_release(lake, "r1", allow_contamination=reason, progress=progress)
    assert stages == []
    assert merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="R").row_count == 9
    assert create_release(lake, "r1", allow_contamination="R").row_count == 6


def _released_rows_and_notes(lake, release: str):
    """The release's ``released`` lineage rows, and the (sample_id, reason) of those noting a contamination."""
    lineage = lake.read("lineage")
    rows = lineage.filter(pc.and_(pc.equal(lineage.column("action"), "released"),
                                  pc.equal(lineage.column("ref"), release)))
    noted = sorted((s, r) for s, r in zip(rows.column("sample_id").to_pylist(), rows.column("reason").to_pylist())
                   if "contamination" in r)
    return rows, noted


def test_a_check_recorded_by_another_matcher_version_is_not_reused(tmp_path, monkeypatch):
    """A recorded clean check names the matcher (text normalization and n-gram hashing) that made it: once the
    matcher changes (``ngrams.MATCHER_VERSION`` bumped), merge and redact read the rows again, and a parent's allowed
    contamination no longer carries over to a redact without a new --allow-contamination."""
    from operators.decontam import ngrams

    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "clean", table="other")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky", allow_contamination="dev split")
    before = getattr(ngrams, "MATCHER_VERSION", 1)
    assert get_release(lake, "clean").details["contamination"].get("matcher") == before
    scanned: list[int] = []

    def progress(stage, done, total):
        if stage == "eval-set check":
            scanned.append(done)

    merge_releases(lake, "mix", sources=["clean"], progress=progress)
    assert scanned == []  # the same matcher: the create's check is taken
    monkeypatch.setattr(ngrams, "MATCHER_VERSION", before + 1, raising=False)
    from datahub.release import redact

    redacted = redact(lake, "clean-r", source="clean", sample_ids=[sample_id_of(OTHER[0])], reason="PII",
                      progress=progress)
    assert scanned and scanned[-1] == 2 and "recorded_by" not in redacted.details["contamination"]
    scanned.clear()
    merged = merge_releases(lake, "mix2", sources=["clean"], progress=progress)
    assert scanned and scanned[-1] == 3
    check = merged.details["contamination"]["releases"]["clean"]
    assert "recorded_by" not in check and check["matcher"] == before + 1
    with pytest.raises(ReleaseError, match="'leaky-r' refused: .*2 sample\\(s\\)"):
        redact(lake, "leaky-r", source="leaky", sample_ids=[sample_id_of(CLEAN[0])], reason="PII")
