"""``release redact`` passes the eval-set gate of ``release create`` and ``merge``: a redact made a new release from its
parent's rows without any check, so an eval set registered after the parent was released leaked into it (exit 0), and
a parent released with allowed contamination gave a child whose lineage no longer said so."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.compute as pc
import pytest

from datahub.errors import ReleaseError
from datahub.evalset import add_evalset
from datahub.lake import Lake
from datahub.release import create_release, get_release, list_releases, merge_releases, redact
from datahub.sample_id import sample_id_of
from tests.evalset.helpers import write_evalset
from tests.release.helpers import add_samples
from tests.release.test_crash_rerun import kill_before_record  # noqa: F401  (fixture)
from tests.release.test_merge_evalset_gate import CLEAN, LEAKED, OTHER

LEAKED_IDS = sorted(sample_id_of(t) for t in LEAKED)
GONE = sample_id_of(CLEAN[0])  # what the take-downs below remove (not contaminated)


def _released_reasons(lake: Lake, name: str) -> list[tuple[str, str | None]]:
    lineage = lake.read("lineage")
    rows = lineage.filter(pc.and_(pc.equal(lineage.column("action"), "released"),
                                  pc.equal(lineage.column("ref"), name)))
    return sorted(zip(rows.column("sample_id").to_pylist(), rows.column("reason").to_pylist()))


def _noted(lake: Lake, name: str) -> list[tuple[str, str | None]]:
    return [(s, r) for s, r in _released_reasons(lake, name) if "contamination" in (r or "")]


def _stages(seen: list[str]):
    def progress(stage, done, total):
        seen.append(stage)
    return progress


def _leaky_then_bench(tmp_path) -> Lake:
    """Release ``leaky`` (CLEAN + LEAKED) created before eval set ``bench`` was registered, then ``bench`` added."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    return lake


def test_a_redact_after_a_newly_registered_overlapping_eval_set_is_refused_before_anything_is_written(tmp_path):
    lake = _leaky_then_bench(tmp_path)
    with pytest.raises(ReleaseError) as refused:
        redact(lake, "leaky-r", source="leaky", sample_ids=[GONE], reason="PII #1")
    message = str(refused.value)
    version = get_release(lake, "leaky").version
    assert message.startswith("release 'leaky-r' refused: in the rows of release 'leaky' that the redact keeps, "
                              f"2 sample(s) of samples v{version} overlap eval sets [bench@1: 2 sample(s)]"), message
    assert all(sample_id in message for sample_id in LEAKED_IDS), message
    assert "datahub evalset check --release leaky --ids-out IDS" in message and "--ids-file IDS" in message
    assert '--allow-contamination "REASON"' in message
    assert [r.name for r in list_releases(lake)] == ["leaky"]
    assert not lake.exists("release_leaky-r") and not lake.exists("redacted_samples")
    # taking the contaminated samples down too makes a clean release, its check recorded
    clean = redact(lake, "leaky-r", source="leaky", sample_ids=[GONE, *LEAKED_IDS], reason="PII #1 and bench")
    recorded = clean.details["contamination"]
    assert (recorded["contaminated"], recorded["rows_checked"], recorded["allowed"]) == (0, 3, None)
    assert (recorded["table"], recorded["version"], recorded["evalsets"]) == ("release_leaky-r", clean.version,
                                                                              ["bench@1"])


def test_a_redact_with_allow_contamination_records_the_reason_in_the_release_and_the_samples_lineage(tmp_path):
    lake = _leaky_then_bench(tmp_path)
    with pytest.raises(ReleaseError, match="needs a reason"):
        redact(lake, "leaky-r", source="leaky", sample_ids=[GONE], reason="PII #1", allow_contamination=" ")
    release = redact(lake, "leaky-r", source="leaky", sample_ids=[GONE], reason="PII #1",
                     allow_contamination="bench is a public dev split")
    assert release.row_count == 5
    recorded = get_release(lake, "leaky-r").details["contamination"]
    assert recorded["allowed"] == "bench is a public dev split" and recorded["contaminated"] == 2
    assert recorded["by_evalset"] == {"bench@1": 2} and recorded["rows_checked"] == 5
    assert "carried_from" not in recorded
    note = "redact; contamination allowed: bench is a public dev split"
    assert _noted(lake, "leaky-r") == sorted([(sample_id_of(LEAKED[0]), f"{note} (bench@1:q2)"),
                                              (sample_id_of(LEAKED[1]), f"{note} (bench@1:q3)")])
    assert len(_released_reasons(lake, "leaky-r")) == 5


def test_a_redact_of_a_parent_checked_clean_takes_its_check_without_reading_the_rows_again(tmp_path):
    """A redact only removes rows: a clean check of the parent against the same eval-set contents, n-gram size and
    matcher covers the child. The child records whose check it took, and a merge of the child takes that record too;
    once another eval-set version is registered, the rows are read again."""
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "plain")  # checked clean against bench@1
    stages: list[str] = []
    child = redact(lake, "plain-r", source="plain", sample_ids=[GONE], reason="PII #1", progress=_stages(stages))
    assert "eval-set check" not in stages and "write" in stages
    recorded = child.details["contamination"]
    assert (recorded["recorded_by"], recorded["reused_check_of"]) == ("plain", "plain")
    assert (recorded["rows_checked"], recorded["contaminated"], recorded["allowed"]) == (3, 0, None)
    assert (recorded["table"], recorded["version"]) == ("release_plain-r", child.version)
    stages.clear()
    merged = merge_releases(lake, "mix", sources=["plain-r"], progress=_stages(stages))
    assert "eval-set check" not in stages
    assert merged.details["contamination"]["releases"]["plain-r"]["recorded_by"] == "plain"
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench2.jsonl", items=[(
        "z9", "an entirely new question about the melting point of gallium in a warm human hand", "29.8 C")]))
    stages.clear()
    again = redact(lake, "plain-r2", source="plain", sample_ids=[GONE], reason="PII #1", progress=_stages(stages))
    assert "eval-set check" in stages
    assert again.details["contamination"]["evalsets"] == ["bench@2"]
    assert "recorded_by" not in again.details["contamination"]


def test_a_parent_released_with_allowed_contamination_passes_it_on_to_the_samples_that_stay(tmp_path):
    """The parent let its contaminated samples out with a reason, against the eval sets registered now: the child
    needs no new --allow-contamination, and carries the reason (release record and each surviving sample's lineage).
    Once another eval set is registered the parent's reason no longer covers what a check finds: refused."""
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky", allow_contamination="dev split")
    child = redact(lake, "leaky-r", source="leaky", sample_ids=[GONE, LEAKED_IDS[0]], reason="PII #1")
    recorded = child.details["contamination"]
    assert (recorded["allowed"], recorded["carried_from"], recorded["contaminated"]) == ("dev split", "leaky", 1)
    kept = LEAKED_IDS[1]
    item = "q2" if kept == sample_id_of(LEAKED[0]) else "q3"
    assert _noted(lake, "leaky-r") == [(kept, f"redact; contamination allowed: dev split (bench@1:{item})")]
    shown = subprocess.run([sys.executable, "-m", "datahub.cli.main", "lineage", kept, "--lake", lake.root, "--json"],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert [e["reason"] for e in json.loads(shown.stdout)["events"] if e["action"] == "released"
            and e["ref"] == "leaky-r"] == [f"redact; contamination allowed: dev split (bench@1:{item})"]
    # a grandchild carries it on; taking the last contaminated sample down leaves nothing to carry
    assert redact(lake, "leaky-r2", source="leaky-r", sample_ids=[sample_id_of(CLEAN[1])],
                  reason="PII #2").details["contamination"]["allowed"] == "dev split"
    clean = redact(lake, "leaky-r3", source="leaky-r", sample_ids=[kept], reason="bench")
    assert clean.details["contamination"]["allowed"] is None and _noted(lake, "leaky-r3") == []
    add_evalset(lake, "other", write_evalset(tmp_path / "other.jsonl", items=[(
        "o1", OTHER[0], "harbours")]))
    with pytest.raises(ReleaseError, match="'leaky-r4' refused: .*1 sample\\(s\\) of release_leaky-r v\\d+ overlap"):
        redact(lake, "leaky-r4", source="leaky-r", sample_ids=[sample_id_of(CLEAN[1])], reason="PII #2")


def test_a_redact_killed_before_its_record_finishes_with_allow_contamination_and_notes_it_late(
        tmp_path, kill_before_record):
    """As merge and create: killed after its table and lineage commits, then an overlapping eval set is registered:
    the re-run is refused without --allow-contamination; with it, the re-run finishes the first try's commits and
    notes the contaminated samples in a lineage commit of their own (a re-run with another reason is refused)."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky")
    kill_before_record(redact, lake, "r", source="leaky", sample_ids=[GONE], reason="PII #1")
    assert lake.exists("release_r") and "r" not in [x.name for x in list_releases(lake)]
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    with pytest.raises(ReleaseError, match="overlap eval sets"):
        redact(lake, "r", source="leaky", sample_ids=[GONE], reason="PII #1")
    kill_before_record(redact, lake, "r", source="leaky", sample_ids=[GONE], reason="PII #1",
                       allow_contamination="found late")
    with pytest.raises(ReleaseError, match="this run has allow_contamination=\"another\""):
        redact(lake, "r", source="leaky", sample_ids=[GONE], reason="PII #1", allow_contamination="another")
    release = redact(lake, "r", source="leaky", sample_ids=[GONE], reason="PII #1", allow_contamination="found late")
    assert release.row_count == 5 and release.details["contamination"]["allowed"] == "found late"
    late = "redact; contamination allowed: found late"
    assert _noted(lake, "r") == sorted([(sample_id_of(LEAKED[0]), f"{late} (bench@1:q2)"),
                                        (sample_id_of(LEAKED[1]), f"{late} (bench@1:q3)")])
    assert len(_released_reasons(lake, "r")) == 5 + 2  # the first try's rows, and one noted row per contaminated sample


def test_cli_redact_refuses_then_takes_the_ids_out_or_allows(tmp_path):
    """The refusal names the release, the eval set, the count and both fixes; `evalset check --ids-out` then a second
    --ids-file makes a clean release; --allow-contamination lets it out, and --json holds the check."""
    lake = _leaky_then_bench(tmp_path)

    def datahub(*args):
        return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args, "--lake", lake.root],
                              capture_output=True, text=True)

    takedown = tmp_path / "takedown.txt"
    takedown.write_text(GONE + "\n")
    refused = datahub("release", "redact", "r1", "--from", "leaky", "--ids-file", str(takedown), "--reason", "PII #1")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    err = " ".join(refused.stderr.split())
    assert "release 'r1' refused" in err and "2 sample(s)" in err and "bench@1: 2 sample(s)" in err, err
    assert "--ids-out IDS" in err and '--allow-contamination "REASON"' in err, err
    assert [r.name for r in list_releases(lake)] == ["leaky"]
    leaked = tmp_path / "leaked.txt"
    assert datahub("evalset", "check", "--release", "leaky", "--ids-out", str(leaked)).returncode == 1
    clean = datahub("release", "redact", "r1", "--from", "leaky", "--ids-file", str(takedown), "--ids-file",
                    str(leaked), "--reason", "PII #1", "--json")
    assert clean.returncode == 0, clean.stderr
    shown = json.loads(clean.stdout)
    assert shown["row_count"] == 3 and shown["details"]["contamination"]["contaminated"] == 0
    allowed = datahub("release", "redact", "r2", "--from", "leaky", "--ids-file", str(takedown), "--reason", "PII #1",
                      "--allow-contamination", "held-out split", "--json")
    assert allowed.returncode == 0, allowed.stderr
    recorded = json.loads(allowed.stdout)["details"]["contamination"]
    assert (recorded["allowed"], recorded["contaminated"]) == ("held-out split", 2)
