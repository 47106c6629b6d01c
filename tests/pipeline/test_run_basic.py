"""End-to-end runs on the shared Ray: accounting, quarantine, lineage, idempotent re-commit."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datahub.lake import Lake
from datahub.operator import BatchOperator, register
from datahub.pipeline.run import run_job


@register
class DropContainsSpam(BatchOperator):
    name = "test_drop_spam"

    def process(self, table):
        return self.mark_dropped(table, pc.match_substring(table.column("text"), "spam"), "spam_word")


@pytest.fixture
def corpus(tmp_path):
    """Two JSONL files and a Parquet file with a known mix of good, spammy and broken records."""
    root = tmp_path / "in"
    root.mkdir()
    good = [f"Document {i} talks about topic {i % 7} in plain words." for i in range(40)]
    lines = [json.dumps({"text": t}).encode() for t in good[:30]]
    lines += [json.dumps({"text": f"buy spam now {i}"}).encode() for i in range(5)]
    lines += [b"{broken json", b'{"text": "\xff\xfe"}', json.dumps({"text": "   "}).encode()]
    (root / "a.jsonl.gz").write_bytes(gzip.compress(b"\n".join(lines), mtime=0))
    (root / "b.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in good[30:]) + "\n")
    pq.write_table(pa.table({"text": [good[0], "spam in parquet", None]}), root / "c.parquet")
    expected = {"records": 38 + 10 + 3, "dropped": 6, "quarantined": 4, "written": 38 + 10 + 3 - 6 - 4}
    return root, expected


def spec_for(job_spec, root, **extra):
    return job_spec(
        inputs=[{"uri": str(root / "*.jsonl*")}, {"uri": str(root / "*.parquet")}],
        graph={
            "normalize": {"op": "normalize_text"},
            "spam": {"op": "test_drop_spam", "after": ["normalize"]},
            "samples": {"sink": "samples", "after": ["spam"]},
            "stats": {"sink": "stats", "after": ["normalize"]},  # a second branch off one node
        },
        **extra,
    )


def test_accounting_quarantine_and_lineage(job_spec, corpus, ray_engine):
    root, expected = corpus
    spec = spec_for(job_spec, root)
    result = run_job(spec, engine=ray_engine)
    counts = result.counts
    assert result.status == "succeeded"
    assert counts["records_read"] == expected["records"]
    assert counts["records_read"] == counts["samples_written"] + counts["dropped_total"] + counts["quarantined_total"]
    assert counts["dropped"] == {"spam_word": expected["dropped"]}
    assert counts["quarantined"] == {"invalid_json": 1, "invalid_utf8": 1, "empty_document": 1, "missing_text_field": 1}

    lake = Lake(spec.lake.root)
    samples = lake.read("samples")
    assert samples.num_rows == expected["written"]
    assert {"sample_id", "text", "source_uri", "source_offset", "ingest_run_id", "meta"} <= set(samples.column_names)
    assert not [c for c in samples.column_names if c.startswith("_")]
    assert set(samples.column("ingest_run_id").to_pylist()) == {result.run_id}
    # the same text in a.jsonl.gz and c.parquet has the same deterministic id
    ids = samples.column("sample_id").to_pylist()
    assert len(ids) - len(set(ids)) == 1

    quarantine = lake.read("quarantine").to_pylist()
    by_reason = {q["reason"]: q for q in quarantine}
    assert by_reason["invalid_json"]["source_uri"].endswith("a.jsonl.gz") and by_reason["invalid_json"]["source_offset"] == 36
    assert by_reason["invalid_json"]["raw"] == b"{broken json"
    assert by_reason["missing_text_field"]["source_uri"].endswith("c.parquet")

    lineage = lake.read("lineage")
    actions = Counter(lineage.column("action").to_pylist())
    assert actions["ingested"] == expected["records"] - 3  # every record with a text has an origin event
    assert actions["dropped"] == expected["dropped"] and actions["quarantined"] == 1  # the empty document
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped")).to_pylist()
    assert {d["op"] for d in dropped} == {"test_drop_spam@1"} and {d["reason"] for d in dropped} == {"spam_word"}
    ingested = lineage.filter(pc.equal(lineage.column("action"), "ingested")).to_pylist()
    origin = json.loads(ingested[0]["ref"])
    assert set(origin) == {"source_uri", "source_offset"}

    stats = result.stats["stats"]
    assert stats["rows"] == expected["records"] and sum(stats["live_by_source"].values()) == expected["records"] - 4

    runs = lake.read("runs").to_pylist()
    assert len(runs) == 1 and runs[0]["status"] == "succeeded"
    assert runs[0]["operators"] == ["normalize_text@1", "test_drop_spam@1"]
    assert {i["uri"].rsplit("/", 1)[-1] for i in runs[0]["inputs"]} == {"a.jsonl.gz", "b.jsonl", "c.parquet"}
    assert json.loads(runs[0]["counts"])["records_read"] == expected["records"]


def test_rerun_is_idempotent_and_incremental(job_spec, corpus, ray_engine):
    root, expected = corpus
    spec = spec_for(job_spec, root)
    first = run_job(spec, engine=ray_engine)
    lake = Lake(spec.lake.root)
    versions = {t: lake.version(t) for t in ("samples", "quarantine", "lineage", "runs")}
    again = run_job(spec, engine=ray_engine)
    assert again.status == "skipped"
    assert {t: lake.version(t) for t in versions} == versions

    (root / "d.jsonl").write_text(json.dumps({"text": "A brand new document arrives later."}) + "\n")
    third = run_job(spec, engine=ray_engine)
    assert third.status == "succeeded" and third.run_id != first.run_id
    assert [u.rsplit("/", 1)[-1] for u in third.inputs] == ["d.jsonl"]
    assert lake.read("samples").num_rows == expected["written"] + 1


def test_crash_between_commits_recovers_exactly(job_spec, corpus, ray_engine, monkeypatch):
    """A crash after the samples commit: the re-run commits only what is missing."""
    root, expected = corpus
    spec = spec_for(job_spec, root)
    import datahub.pipeline.run as run_module

    real_commit = run_module._commit_run_row

    def crash(*args, **kwargs):
        if kwargs.get("txn", "").count("/failed/") == 0:
            raise KeyboardInterrupt("simulated crash before the runs commit")
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(run_module, "_commit_run_row", crash)
    with pytest.raises(KeyboardInterrupt):
        run_job(spec, engine=ray_engine)
    lake = Lake(spec.lake.root)
    assert lake.read("samples").num_rows == expected["written"] and not lake.exists("runs")
    monkeypatch.setattr(run_module, "_commit_run_row", real_commit)
    result = run_job(spec, engine=ray_engine)
    assert result.status == "succeeded"
    # committed by the crashed run: skipped, and the version it committed is recorded (was None)
    assert result.table_versions["samples"] == lake.version("samples")
    assert lake.read("samples").num_rows == expected["written"]
    lineage = lake.read("lineage")
    assert Counter(lineage.column("action").to_pylist())["ingested"] == expected["records"] - 3
