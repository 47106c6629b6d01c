"""``release create`` refuses a table that overlaps a registered eval set, unless the reason is given and recorded."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.compute as pc
import pytest

from datahub.errors import ReleaseError
from datahub.evalset import add_evalset, contamination, list_evalsets
from datahub.lake import Lake
from datahub.release import create_release, get_release, list_releases
from datahub.sample_id import sample_id_of
from tests.evalset.helpers import QUESTIONS, item_text, write_evalset
from tests.release.helpers import add_samples
from tests.release.test_crash_rerun import kill_before_record  # noqa: F401  (fixture)
from operators.decontam import ngrams

CLEAN = [f"an ordinary training document number {i} about gardening, tools, soil and the weather in spring" for i in range(6)]


def _lake(tmp_path, texts):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, texts, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    return lake


def test_contaminated_table_is_refused_with_set_and_count(tmp_path):
    leaked = ["Forum post: " + item_text("q2").upper() + " thanks!", "Quiz answers. " + item_text("q3")]
    lake = _lake(tmp_path, CLEAN + leaked)
    found = contamination(lake, batch_rows=3)  # three batches: the check streams
    assert found.rows_checked == 8 and found.by_evalset == {"bench@1": 2}
    assert found.refs == {sample_id_of(leaked[0]): "bench@1:q2", sample_id_of(leaked[1]): "bench@1:q3"}
    with pytest.raises(ReleaseError, match=r"(?s)refused: 2 sample\(s\) of samples v\d+ overlap eval sets \[bench@1: 2 sample"
                                           r"\(s\)\].*--allow-contamination"):
        create_release(lake, "r1")
    assert list_releases(lake) == []


def test_allowed_contamination_is_recorded_in_release_and_lineage(tmp_path):
    leaked = "Quiz answers. " + item_text("q3")
    lake = _lake(tmp_path, CLEAN + [leaked])
    with pytest.raises(ReleaseError, match="needs a reason"):
        create_release(lake, "r1", allow_contamination="  ")
    release = create_release(lake, "r1", allow_contamination="bench@1 is a public dev split we do not score on")
    assert release.row_count == 7
    recorded = get_release(lake, "r1").details["contamination"]
    assert recorded["allowed"] == "bench@1 is a public dev split we do not score on"
    assert recorded["by_evalset"] == {"bench@1": 1} and recorded["contaminated"] == 1
    lineage = lake.read("lineage")
    released = lineage.filter(pc.equal(lineage.column("action"), "released"))
    reasons = dict(zip(released.column("sample_id").to_pylist(), released.column("reason").to_pylist()))
    assert reasons[sample_id_of(leaked)] == ("contamination allowed: bench@1 is a public dev split we do not score on "
                                             "(bench@1:q3)")
    assert [reasons[sample_id_of(t)] for t in CLEAN] == [None] * 6


def test_clean_table_releases_and_records_the_check(tmp_path):
    lake = _lake(tmp_path, CLEAN)
    release = create_release(lake, "r1")
    assert release.details["contamination"] == {"table": "samples", "version": release.version, "rows_checked": 6,
                                                "evalsets": ["bench@1"], "by_evalset": {}, "contaminated": 0,
                                                "ngram": 13, "evalset_digests": {"bench@1": list_evalsets(lake)[0].digest},
                                                "matcher": ngrams.MATCHER_VERSION, "allowed": None}


def test_cli_refuses_then_allows(tmp_path):
    lake = _lake(tmp_path, CLEAN + ["copied: " + item_text("q1")])

    def datahub(*args):
        return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], capture_output=True, text=True)

    listed = datahub("evalset", "list", "--lake", lake.root, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(s["name"], s["version"], s["items"]) for s in json.loads(listed.stdout)] == [("bench", 1, 3)]
    checked = datahub("evalset", "check", "--lake", lake.root, "--json")
    assert json.loads(checked.stdout)["by_evalset"] == {"bench@1": 1}
    refused = datahub("release", "create", "r1", "--lake", lake.root)
    assert refused.returncode == 2 and "bench@1: 1 sample" in refused.stderr
    allowed = datahub("release", "create", "r1", "--lake", lake.root, "--allow-contamination", "held-out split", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["details"]["contamination"]["allowed"] == "held-out split"


def test_a_table_that_is_not_of_samples_is_refused_by_name_not_with_a_traceback(tmp_path):
    """The quarantine table holds raw rejected records (no sample_id, no text): neither the eval-set check nor a
    release can read it, so both say so (before: pyarrow's 'No match for FieldRef.Name(sample_id)' traceback)."""
    from datetime import datetime, timezone

    import pyarrow as pa

    from datahub.errors import SpecError
    from datahub.lake.tables import QUARANTINE

    lake = _lake(tmp_path, CLEAN)
    raw = json.dumps({"text": item_text("q1")}).encode()  # eval text inside a rejected record
    lake.commit("quarantine", pa.Table.from_pylist(
        [{"source_uri": "s3://bucket/a.jsonl", "source_offset": 7, "source_format": "jsonl", "reason": "oversize",
          "detail": None, "raw": raw, "raw_size": len(raw), "run_id": "job-aaaaaaaaaaaa",
          "ts": datetime.now(timezone.utc)}], QUARANTINE), txn="q/job-aaaaaaaaaaaa")
    with pytest.raises(SpecError, match=r"table 'quarantine' is not a table of samples \(no sample_id and text "
                                        r"columns; it has source_uri, .*raw.*\).*--table samples"):
        contamination(lake, table="quarantine")
    with pytest.raises(ReleaseError, match=r"release 'q1' refused: table 'quarantine' is not a table of samples .*"
                                           r"datahub quarantine --lake "):
        create_release(lake, "q1", table="quarantine")
    assert list_releases(lake) == []


def test_a_create_killed_after_its_lineage_commit_finishes_with_allow_contamination_and_notes_it(
        tmp_path, kill_before_record):
    """Killed after its lineage commit, then an overlapping eval set is registered: the re-run is refused without
    --allow-contamination and, before, was refused with it too ('choose a new release name'); now it finishes, and
    the allowed reason of each contaminated sample is written to the lineage in a commit of its own."""
    leaked = "Quiz answers. " + item_text("q3")
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN + [leaked], "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    kill_before_record(create_release, lake, "r1")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    with pytest.raises(ReleaseError, match="overlap eval sets"):
        create_release(lake, "r1")
    release = create_release(lake, "r1", allow_contamination="held-out split")
    assert release.details["contamination"]["allowed"] == "held-out split" and release.row_count == 7
    lineage = lake.read("lineage")
    rows = lineage.filter(pc.and_(pc.equal(lineage.column("action"), "released"),
                                  pc.equal(lineage.column("ref"), "r1")))
    reasons = sorted(zip(rows.column("sample_id").to_pylist(), rows.column("reason").to_pylist()),
                     key=lambda row: (row[0], row[1] or ""))
    assert [r for s, r in reasons if s == sample_id_of(leaked)] == [None, "contamination allowed: held-out split "
                                                                           "(bench@1:q3)"]
    assert rows.num_rows == 8


def test_a_create_whose_lineage_gives_an_allowed_reason_is_finished_with_that_reason_only(tmp_path, kill_before_record):
    """The first try wrote 'contamination allowed: R' into its samples' lineage and was killed; the eval set got a new
    version since, which no sample overlaps: the re-run must still give R (the lineage says it), and then finishes."""
    leaked = "Quiz answers. " + item_text("q3")
    lake = _lake(tmp_path, CLEAN + [leaked])
    kill_before_record(create_release, lake, "r1", allow_contamination="dev split")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench2.jsonl", items=[
        ("z9", "an entirely new question about the melting point of gallium in a warm human hand", "29.8 C")]))
    with pytest.raises(ReleaseError, match="allow_contamination=\"dev split\"; this run has allow_contamination=null"):
        create_release(lake, "r1")
    with pytest.raises(ReleaseError, match="this run has allow_contamination=\"other\""):
        create_release(lake, "r1", allow_contamination="other")
    release = create_release(lake, "r1", allow_contamination="dev split")
    assert release.row_count == 7 and release.details["contamination"]["evalsets"] == ["bench@2"]


def _released_reasons(lake: Lake, name: str) -> dict[str, list[str | None]]:
    """sample_id -> the reasons of its ``released`` lineage rows of release ``name``."""
    lineage = lake.read("lineage")
    rows = lineage.filter(pc.and_(pc.equal(lineage.column("action"), "released"),
                                  pc.equal(lineage.column("ref"), name)))
    out: dict[str, list[str | None]] = {}
    for sample_id, reason in zip(rows.column("sample_id").to_pylist(), rows.column("reason").to_pylist()):
        out.setdefault(sample_id, []).append(reason)
    return out


@pytest.mark.parametrize("first_try_allowed", [False, True])
def test_samples_an_eval_set_overlaps_only_since_an_earlier_try_are_noted_in_the_lineage_too(
        tmp_path, kill_before_record, first_try_allowed):
    """Killed after the lineage (and its contamination notes for bench@1: q3) was committed; bench@2 adds q1, which
    another sample overlaps: the re-run with the same reason records 2 contaminated samples, so both must have a
    released row saying 'contamination allowed' (before, only the check that wrote the first notes was noted: the
    sample overlapping q1 had none). The notes are written once per check (eval-set contents): a re-run of the same
    check adds nothing. ``first_try_allowed``: bench@1 was there on the first try (its lineage commit carries the
    notes), or registered after it (the notes went into a commit of their own)."""
    q1, q3 = "Trivia: " + item_text("q1"), "Quiz answers. " + item_text("q3")
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN + [q3, q1], "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    bench1 = write_evalset(tmp_path / "b1.jsonl", items=[q for q in QUESTIONS if q[0] != "q1"])
    if first_try_allowed:
        add_evalset(lake, "bench", bench1)
        kill_before_record(create_release, lake, "r1", allow_contamination="R")
    else:
        kill_before_record(create_release, lake, "r1")
        add_evalset(lake, "bench", bench1)
        kill_before_record(create_release, lake, "r1", allow_contamination="R")
    noted = [r for r in _released_reasons(lake, "r1")[sample_id_of(q3)] if r]
    assert noted == ["contamination allowed: R (bench@1:q3)"]
    add_evalset(lake, "bench", write_evalset(tmp_path / "b2.jsonl"))  # bench@2: q1, q2, q3
    kill_before_record(create_release, lake, "r1", allow_contamination="R")
    with pytest.raises(ReleaseError, match="this run has allow_contamination=\"other\""):
        create_release(lake, "r1", allow_contamination="other")
    release = create_release(lake, "r1", allow_contamination="R")
    assert release.details["contamination"]["by_evalset"] == {"bench@2": 2}
    reasons = _released_reasons(lake, "r1")
    assert [r for r in reasons[sample_id_of(q1)] if r] == ["contamination allowed: R (bench@2:q1)"]
    assert sorted(r for r in reasons[sample_id_of(q3)] if r) == ["contamination allowed: R (bench@1:q3)",
                                                                "contamination allowed: R (bench@2:q3)"]
    # the first try's rows (with bench@1's note, or that note in a commit of its own), then bench@2's notes, once
    assert sum(len(r) for r in reasons.values()) == 8 + (0 if first_try_allowed else 1) + 2
