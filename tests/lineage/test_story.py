"""Per-sample lineage through a real pipeline run on the shared Ray: modified, dropped, quarantined."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from datahub.lake import Lake
from datahub.lineage import lineage_events, optimize_lineage, sample_lineage, source_lineage
from datahub.operator import BatchOperator, register
from datahub.pipeline.run import run_job
from datahub.release import create_release
from datahub.sample_id import sample_id_of

ORIGINAL = "Hello   world,  this text has   extra spaces."  # normalize_text collapses them
DUPLICATE = "A copy of the original text, marked as a duplicate."
KEPT_TWIN = "The original text that the duplicate copies."


@register
class MarkLineageTestDuplicate(BatchOperator):
    """Test-only stand-in for exact dedup: drops the DUPLICATE text with dup_of = KEPT_TWIN's id."""

    name = "test_lineage_mark_duplicate"

    def process(self, table: pa.Table) -> pa.Table:
        mask = pc.equal(table.column("text"), DUPLICATE)
        ref = pa.array([json.dumps({"dup_of": sample_id_of(KEPT_TWIN), "cluster_id": "c1"})] * table.num_rows)
        return self.mark_dropped(table, mask, "exact_duplicate", ref=ref)


@pytest.fixture(scope="module")
def lineage_lake(tmp_path_factory, ray_engine):
    from datahub.config.spec import validate_job_spec

    root = tmp_path_factory.mktemp("lineage")
    lines = [json.dumps({"text": t}).encode() for t in (ORIGINAL, KEPT_TWIN, DUPLICATE, "plain kept text")]
    lines += [b"{not json", json.dumps({"text": "  "}).encode()]
    source = root / "in" / "docs.jsonl.gz"
    source.parent.mkdir()
    source.write_bytes(gzip.compress(b"\n".join(lines), mtime=0))
    spec = validate_job_spec({
        "name": "lineagetest",
        "lake": {"root": str(root / "lake")},
        "inputs": [{"uri": str(source)}],
        "graph": {
            "normalize": {"op": "normalize_text"},
            "dedup": {"op": "test_lineage_mark_duplicate", "after": ["normalize"]},
            "samples": {"sink": "samples", "after": ["dedup"]},
        },
    }, source="test.yaml")
    result = run_job(spec, engine=ray_engine)
    assert result.status == "succeeded"
    lake = Lake(spec.lake.root)
    create_release(lake, "lin-1")
    return lake, str(source), result.run_id


def test_story_of_modified_sample(lineage_lake):
    lake, source, run_id = lineage_lake
    story = sample_lineage(lake, sample_id_of(ORIGINAL))
    assert story.fate == "kept"
    assert story.origins == [{"source_uri": source, "source_offset": 1, "run_id": run_id}]  # JSONL offsets are line numbers
    assert [(e["action"], e["op"]) for e in story.events] == [
        ("ingested", "ingest@1"), ("modified", "normalize_text@1"), ("released", "release@1")]
    assert story.events[1]["params_hash"] and story.releases == ["lin-1"]


def test_story_of_duplicate_and_quarantined(lineage_lake):
    lake, source, _ = lineage_lake
    dup = sample_lineage(lake, sample_id_of(DUPLICATE))
    assert dup.fate == "dropped" and dup.releases == []
    drop = [e for e in dup.events if e["action"] == "dropped"]
    assert drop[0]["reason"] == "exact_duplicate" and drop[0]["op"] == "test_lineage_mark_duplicate@1"
    assert drop[0]["ref"] == {"dup_of": sample_id_of(KEPT_TWIN), "cluster_id": "c1"}

    empty = sample_lineage(lake, sample_id_of("  "))
    assert empty.fate == "quarantined"
    assert [e["reason"] for e in empty.events if e["action"] == "quarantined"] == ["empty_document"]
    assert sample_lineage(lake, "0" * 32).fate == "unknown"

    story = source_lineage(lake, source)
    by_offset = {r["source_offset"]: r for r in story.records}
    assert story.counts == {"dropped": 1, "kept": 3, "quarantined": 2}
    assert by_offset[3]["fate"] == "dropped" and by_offset[3]["reason"] == "exact_duplicate"
    assert by_offset[5]["fate"] == "quarantined" and by_offset[5]["sample_id"] is None  # from the quarantine table
    assert by_offset[5]["reason"] == "invalid_json"
    assert by_offset[6]["reason"] == "empty_document" and by_offset[6]["sample_id"] == sample_id_of("  ")
    assert by_offset[1]["releases"] == ["lin-1"]


def test_lookup_survives_optimize_and_cli(lineage_lake, tmp_path):
    lake, source, _ = lineage_lake
    before = lineage_events(lake, sample_id_of(ORIGINAL)).to_pylist()
    metrics = optimize_lineage(lake)
    assert metrics["numFilesAdded"] >= 1
    assert lineage_events(lake, sample_id_of(ORIGINAL)).to_pylist() == before
    runner = CliRunner()
    from datahub.cli.main import app

    out = runner.invoke(app, ["lineage", sample_id_of(ORIGINAL), "--lake", lake.root, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["releases"] == ["lin-1"]
    text = runner.invoke(app, ["lineage", sample_id_of(DUPLICATE), "--lake", lake.root])
    assert "exact_duplicate" in text.output and "dropped" in text.output
    by_source = runner.invoke(app, ["lineage", "--source", source, "--lake", lake.root, "--json"])
    assert json.loads(by_source.output)["counts"]["quarantined"] == 2
