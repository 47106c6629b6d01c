"""The sample-kind registry and how kinds flow from a job's inputs through the graph."""

from __future__ import annotations

import pyarrow as pa
import pytest

from datahub.config.spec import JobSpec
from datahub.errors import SpecError
from datahub.kinds import KIND_COLUMN, KindSpec, kind_spec, kinds_of, row_fields
from datahub.kinds import base as kinds_base
from datahub.pipeline.graph import build_graph
from datahub.sample_id import sample_ids
from operators.ingest.base import reader_for


def _spec(kind: str) -> JobSpec:
    return JobSpec.model_validate({
        "name": "k", "lake": {"root": "/tmp/unused"},
        "inputs": [{"uri": "/tmp/a.jsonl"}, {"uri": "/tmp/b.jsonl", "kind": kind}],
        "graph": {"length": {"op": "length_filter"}, "samples": {"sink": "samples", "after": ["length"]}},
    })


def test_text_only_jobs_carry_no_kind_column_and_keep_their_job_hash() -> None:
    assert row_fields(["text"]) == []
    spec = _spec("text")
    assert spec.input_kinds() == ["text"]
    legacy = JobSpec.model_validate({
        "name": "k", "lake": {"root": "/tmp/unused"}, "inputs": [{"uri": "/tmp/a.jsonl"}, {"uri": "/tmp/b.jsonl"}],
        "graph": {"length": {"op": "length_filter"}, "samples": {"sink": "samples", "after": ["length"]}},
    })
    assert spec.job_hash() == legacy.job_hash()
    assert _spec("chat").job_hash() != spec.job_hash()


def test_graph_refuses_a_kind_the_operator_does_not_accept() -> None:
    with pytest.raises(SpecError) as info:
        build_graph(_spec("chat"), source="jobs/x.yaml")
    message = str(info.value)
    assert "graph.length" in message and "'chat'" in message and "inputs.1" in message and "accepts: text" in message
    build_graph(_spec("text"), source="jobs/x.yaml")  # the same graph on text inputs is fine


def test_unknown_kind_is_refused_before_any_work() -> None:
    with pytest.raises(Exception) as info:
        _spec("video")
    assert "kind" in str(info.value)
    with pytest.raises(SpecError, match="unknown sample kind 'video'"):
        kind_spec("video")


def test_kinds_of_reads_null_and_absent_as_text() -> None:
    assert kinds_of(pa.table({"text": ["a", "b"]})).to_pylist() == ["text", "text"]
    table = pa.table({"text": ["a", "b"], KIND_COLUMN: pa.array([None, "chat"], pa.string())})
    assert kinds_of(table).to_pylist() == ["text", "chat"]


def test_row_fields_come_in_kinds_order_and_conflicting_types_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = dict(kinds_base._REGISTRY)
    ids = lambda t: sample_ids(t.column("text"))  # noqa: E731
    registry["chat"] = KindSpec("chat", (pa.field("turns", pa.int32()),), ids, "test")
    registry["image_text"] = KindSpec("image_text", (pa.field("width", pa.int32()),), ids, "test")
    monkeypatch.setattr(kinds_base, "_REGISTRY", registry)
    names = [f.name for f in row_fields(["chat", "text", "image_text"])]
    assert names == [KIND_COLUMN, "width", "turns"]  # KINDS order: image_text before chat, whatever the input order
    registry["preference"] = KindSpec("preference", (pa.field("turns", pa.string()),), ids, "test")
    with pytest.raises(SpecError, match="disagree on column 'turns'"):
        row_fields(["chat", "preference"])


def test_a_format_without_a_reader_for_the_kind_says_which_kinds_it_reads() -> None:
    import operators.ingest  # noqa: F401

    assert reader_for("jsonl").format == "jsonl"
    with pytest.raises(Exception, match="format 'warc' has no reader for sample kind 'trajectory'"):
        reader_for("warc", "trajectory")
