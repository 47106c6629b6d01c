"""Inputs that hold no usable record still add up: a 0-byte compressed file is one quarantined
``invalid_stream`` record, a Parquet file without the text column quarantines each of its rows."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job


def test_empty_stream_and_parquet_without_text_column_are_counted_exactly(tmp_path, job_spec):
    root = tmp_path / "in"
    root.mkdir()
    (root / "empty.jsonl.zst").write_bytes(b"")
    pq.write_table(pa.table({"body": ["first", "second"], "lang": ["en", "fr"]}), root / "no_text.parquet")
    (root / "good.jsonl").write_text(json.dumps({"text": "one good document about rivers"}) + "\n")
    spec = job_spec(inputs=[{"uri": str(root / "*.jsonl*")}, {"uri": str(root / "*.parquet")}])
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    counts = result.counts
    assert counts["records_read"] == 4  # 1 invalid stream + 2 Parquet rows + 1 document
    assert counts["quarantined"] == {"invalid_stream": 1, "missing_text_field": 2}
    assert counts["samples_written"] == 1
    assert counts["records_read"] == counts["samples_written"] + counts["dropped_total"] + counts["quarantined_total"]
    quarantine = Lake(spec.lake.root).read("quarantine").to_pylist()
    by_file = {(q["source_uri"].rsplit("/", 1)[-1], q["source_offset"]): q["reason"] for q in quarantine}
    assert by_file == {("empty.jsonl.zst", 0): "invalid_stream", ("no_text.parquet", 0): "missing_text_field",
                       ("no_text.parquet", 1): "missing_text_field"}


def test_a_relative_file_path_lists_as_its_absolute_path(tmp_path, monkeypatch):
    """A plain relative path (no glob) names the file in the current directory, like a glob does."""
    from datahub.config.spec import InputSpec
    from datahub.pipeline.inputs import list_input_files

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "x"}\n')
    monkeypatch.chdir(tmp_path)
    files = list_input_files([InputSpec(uri="in/a.jsonl")])
    assert [f.uri for f in files] == [str(tmp_path / "in" / "a.jsonl")]
    assert [f.uri for f in list_input_files([InputSpec(uri="in/*.jsonl")])] == [f.uri for f in files]
