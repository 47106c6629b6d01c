"""Per-sample lineage through a real pipeline run on the shared Ray, a release and a CFS export:
modified and annotated, dropped as an exact duplicate by the real ``exact_dedup``, quarantined,
released and exported."""

from __future__ import annotations

import gzip
import json
import re
import tarfile

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from datahub.export.export import export_release
from datahub.lake import Lake
from datahub.lineage import lineage_events, optimize_lineage, sample_lineage, source_lineage
from datahub.pipeline.run import run_job
from datahub.release import create_release
from datahub.sample_id import sample_id_of
from tests.export.helpers import cfs_storage

ORIGINAL = "Hello   world,  this text has   extra spaces."  # normalize_text collapses them
# Exact copies after exact_dedup's normalization (case, punctuation); its keep rule keeps the
# smallest sample_id, so the twin with the larger id is the one dropped as a duplicate.
_TWINS = sorted(["The original text that the duplicate copies.", "THE ORIGINAL TEXT, that the duplicate copies!"],
                key=sample_id_of)
KEPT_TWIN, DUPLICATE = _TWINS


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
            "length": {"op": "length_filter", "after": ["normalize"], "params": {"drop": False}},
            "dedup": {"op": "exact_dedup", "after": ["length"]},
            "samples": {"sink": "samples", "after": ["dedup"]},
        },
    }, source="test.yaml")
    result = run_job(spec, engine=ray_engine)
    assert result.status == "succeeded"
    lake = Lake(spec.lake.root)
    create_release(lake, "lin-1")
    manifest = export_release(lake, "lin-1", tier="cfs", storage=cfs_storage(("cfs", root / "cfs")), shard_samples=2)
    return lake, str(source), result.run_id, manifest


def test_story_of_modified_annotated_released_exported_sample(lineage_lake):
    lake, source, run_id, manifest = lineage_lake
    story = sample_lineage(lake, sample_id_of(ORIGINAL))
    assert story.fate == "kept"
    assert story.origins == [{"source_uri": source, "source_offset": 1, "run_id": run_id}]  # JSONL offsets are line numbers
    assert [(e["action"], e["op"]) for e in story.events] == [
        ("ingested", "ingest@1"), ("modified", "normalize_text@1"), ("annotated", "length_filter@1"),
        ("released", "release@1"), ("exported", "export@1")]
    modified, annotated = story.events[1], story.events[2]
    assert modified["params_hash"] and annotated["params_hash"] and modified["params_hash"] != annotated["params_hash"]
    assert {e["run_id"] for e in story.events[:3]} == {run_id}
    # the Python API gives times as every --json date-time: ISO 8601 UTC with 'Z' (it gave isoformat()'s +00:00)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", e["ts"]) for e in story.events)
    released = story.events[3]
    assert (released["ref"], released["run_id"]) == ("lin-1", "release/lin-1") and story.releases == ["lin-1"]
    # the export event names the shard (its URI on the tier) and the tar member that holds the sample
    [export] = story.exports
    shard = next(s for s in manifest.shards if export["shard"] in s.replicas.values())
    assert export["tier"] == "cfs" and export["member"] == f"{sample_id_of(ORIGINAL)}.txt"
    assert shard.replicas["cfs"] == export["shard"]
    with tarfile.open(export["shard"]) as tar:
        member = tar.extractfile(export["member"])
        assert member is not None and member.read().decode() == "Hello world, this text has extra spaces."


def test_story_of_duplicate_and_quarantined(lineage_lake):
    lake, source, run_id, _ = lineage_lake
    dup = sample_lineage(lake, sample_id_of(DUPLICATE))
    assert dup.fate == "dropped" and dup.releases == [] and dup.exports == []
    assert [(e["action"], e["op"]) for e in dup.events] == [
        ("ingested", "ingest@1"), ("annotated", "length_filter@1"), ("dropped", "exact_dedup@1")]
    drop = dup.events[-1]
    assert drop["reason"] == "exact_duplicate" and drop["run_id"] == run_id
    from operators.dedup.exact import content_hash_hex

    content_hash = content_hash_hex(pa.array([KEPT_TWIN])).to_pylist()[0]
    assert content_hash == content_hash_hex(pa.array([DUPLICATE])).to_pylist()[0]
    assert drop["ref"] == {"dup_of": sample_id_of(KEPT_TWIN), "cluster_id": content_hash, "method": "exact"}
    twin = sample_lineage(lake, sample_id_of(KEPT_TWIN))
    assert twin.fate == "kept" and twin.releases == ["lin-1"] and len(twin.exports) == 1

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
    lake, source, _, _ = lineage_lake
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
