"""OpenLineage RunEvents from run_job: file transport, HTTP transport (a real server on loopback), FAIL."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer

import pyarrow as pa
import pytest

from datahub.pipeline.openlineage import SCHEMA_URL, run_event, run_uuid
from datahub.operator import BatchOperator, register
from datahub.pipeline.run import run_job


@register
class FailForOpenLineage(BatchOperator):
    name = "test_openlineage_fail"

    def process(self, table: pa.Table) -> pa.Table:
        raise RuntimeError("boom for the FAIL event")


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "in" / "docs.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(json.dumps({"text": f"document {i}"}) for i in range(5)) + "\n")
    return path


def _check_event(event, *, kind, run_id, job, input_path):
    assert event["eventType"] == kind
    assert event["schemaURL"] == SCHEMA_URL and event["producer"].startswith("https://")
    assert str(uuid.UUID(event["run"]["runId"])) == event["run"]["runId"] == run_uuid(run_id)
    assert uuid.UUID(event["run"]["runId"]).version == 5
    assert event["job"] == {"namespace": "testns", "name": job, "facets": {}}
    assert event["eventTime"].endswith("Z")
    assert [d["name"] for d in event["inputs"]] == [str(input_path)] and event["inputs"][0]["namespace"] == "file"
    assert {d["name"].rsplit("/", 1)[-1] for d in event["outputs"]} >= {"samples", "lineage", "runs"}


def test_file_transport_start_and_complete(job_spec, corpus, tmp_path, ray_engine):
    events_path = tmp_path / "ol" / "events.jsonl"
    spec = job_spec(inputs=[{"uri": str(corpus)}], name="oljob",
                    openlineage={"transport": "file", "path": str(events_path), "namespace": "testns"})
    result = run_job(spec, engine=ray_engine)
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    for event in events:
        _check_event(event, kind=event["eventType"], run_id=result.run_id, job="oljob", input_path=corpus)


class _Collector(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(201)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_http_transport_and_fail_event(job_spec, corpus, ray_engine):
    _Collector.received = []
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        spec = job_spec(inputs=[{"uri": str(corpus)}], name="olfail",
                        graph={"fail": {"op": "test_openlineage_fail"}, "samples": {"sink": "samples", "after": ["fail"]}},
                        openlineage={"transport": "http", "url": url, "namespace": "testns"})
        with pytest.raises(Exception, match="boom"):
            run_job(spec, engine=ray_engine)
    finally:
        server.shutdown()
        server.server_close()
    kinds = [(path, ctype, event["eventType"]) for path, ctype, event in _Collector.received]
    assert kinds == [("/api/v1/lineage", "application/json", "START"), ("/api/v1/lineage", "application/json", "FAIL")]
    fail = _Collector.received[1][2]
    assert "boom for the FAIL event" in fail["run"]["facets"]["errorMessage"]["message"]
    assert fail["run"]["runId"] == _Collector.received[0][2]["run"]["runId"]


def test_unreachable_collector_never_fails_and_s3_naming(tmp_path):
    from datahub.pipeline.openlineage import OpenLineageEmitter

    emitter = OpenLineageEmitter(transport="http", namespace="ns", url="http://127.0.0.1:9/x", timeout_s=0.5)
    event = run_event("START", run_id="r-1", job_namespace="ns", job_name="j",
                      inputs=["s3://bucket/raw/a.jsonl"], outputs=[str(tmp_path / "lake" / "samples")])
    assert emitter.emit(event) is False
    assert event["inputs"] == [{"namespace": "s3://bucket", "name": "raw/a.jsonl", "facets": {}}]
    assert event["outputs"][0] == {"namespace": "file", "name": str(tmp_path / "lake" / "samples"), "facets": {}}


@pytest.mark.parametrize(
    ("openlineage", "expected"),
    [
        ({"transport": "file"}, r"test\.yaml: openlineage: .*openlineage\.path is required for transport: file; add `path:"),
        ({"path": "  "}, r"openlineage\.path is required for transport: file"),  # file is the default transport
        ({"transport": "http", "path": "x.jsonl"}, r"openlineage\.url is required for transport: http; add the collector"),
        ({"transport": "http", "url": "marquez:5000"}, r"openlineage\.url 'marquez:5000': expected an http:// or https://"),
    ],
)
def test_spec_requires_the_target_of_its_transport(job_spec, openlineage, expected):
    from datahub.errors import SpecError

    with pytest.raises(SpecError, match=expected):
        job_spec(openlineage=openlineage)


def test_spec_accepts_each_transport_with_its_target(job_spec, tmp_path):
    file_spec = job_spec(openlineage={"path": str(tmp_path / "events.jsonl")}).openlineage
    http_spec = job_spec(openlineage={"transport": "http", "url": "https://catalog.example/api/v1/lineage"}).openlineage
    assert (file_spec.transport, file_spec.path) == ("file", str(tmp_path / "events.jsonl"))
    assert (http_spec.transport, http_spec.url) == ("http", "https://catalog.example/api/v1/lineage")
