"""The fate of a sample id whose content came twice: exact dedup drops the second record as a duplicate of the
same id (dup_of is the sample itself), so the sample is kept, not dropped (the demo corpus has 10 such samples,
and every incremental run that sees a page again makes one)."""

from __future__ import annotations

import json

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.lineage import sample_lineage, source_lineage
from datahub.pipeline.run import run_job
from datahub.release.create import create_release
from datahub.sample_id import sample_id_of

TWICE = "a page that was crawled twice, word for word, about rivers and valley towns"
ONCE = "a page that was crawled once, about mountains and the long history of the towns"


def test_a_sample_whose_second_copy_was_dropped_is_kept(tmp_path):
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in (TWICE, ONCE, TWICE)))
    spec = validate_job_spec({"name": "twice", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": str(source)}],
                              "graph": {"exact": {"op": "exact_dedup"}, "samples": {"sink": "samples", "after": ["exact"]}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = Lake(tmp_path / "lake")
    create_release(lake, "r1")
    story = sample_lineage(lake, sample_id_of(TWICE))
    drop = next(e for e in story.events if e["action"] == "dropped")
    assert drop["ref"]["dup_of"] == sample_id_of(TWICE)  # the second record, a copy of the same sample
    assert story.fate == "kept" and story.releases == ["r1"]
    assert sample_lineage(lake, sample_id_of(ONCE)).fate == "kept"
    records = source_lineage(lake, str(source)).records
    assert [r["fate"] for r in records] == ["kept", "kept", "kept"]  # one sample id, kept (from its first record)


def test_a_file_story_gives_the_drop_that_decided_the_fate(tmp_path):
    """A sample whose content came twice and was then dropped by a later operator: the file's story showed the
    second copy's 'exact_duplicate' (dup_of the sample itself) as the reason when that event sorted last, while the
    sample is gone because of the later drop (seen on the image demo: image_exact_dedup named instead of
    image_dedup's near_duplicate)."""
    short_twice = "a short page seen twice"
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in (short_twice, ONCE, short_twice)))
    spec = validate_job_spec({"name": "twice", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": str(source)}],
                              "graph": {"exact": {"op": "exact_dedup"},
                                        "length": {"op": "length_filter", "params": {"min_chars": 40}, "after": ["exact"]},
                                        "samples": {"sink": "samples", "after": ["length"]}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = Lake(tmp_path / "lake")
    assert sample_lineage(lake, sample_id_of(short_twice)).fate == "dropped"
    records = source_lineage(lake, str(source)).records
    assert [(r["fate"], r["reason"], r["op"]) for r in records] == [
        ("dropped", "too_few_chars", "length_filter@1"), ("kept", None, None), ("dropped", "too_few_chars", "length_filter@1")]


def test_a_runs_events_follow_its_graph_order(tmp_path):
    """Events of one run share a timestamp; they were ordered by action (modified before annotated), so an
    operator that annotated and a later one that modified were shown the other way round (the chat demo showed
    redact_pii_messages' change before chat_quality's signals). Now the run's operators, as `runs` records them."""
    source = tmp_path / "a.jsonl"
    source.write_text(json.dumps({"text": "a page   with    runs of    spaces about rivers and valley towns"}) + "\n")
    spec = validate_job_spec({"name": "order", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": str(source)}],
                              "graph": {"length": {"op": "length_filter", "params": {"min_chars": 1}},
                                        "normalize": {"op": "normalize_text", "after": ["length"]},
                                        "samples": {"sink": "samples", "after": ["normalize"]}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = Lake(tmp_path / "lake")
    (sample_id,) = lake.read("samples", columns=["sample_id"]).column("sample_id").to_pylist()
    story = sample_lineage(lake, sample_id)
    assert [(e["action"], e["op"]) for e in story.events] == [
        ("ingested", "ingest@1"), ("annotated", "length_filter@1"), ("modified", "normalize_text@1")]
