"""Runs survive radosgw going away and coming back (retries with backoff): an s3:// lake, s3:// inputs."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pytest

from datahub.config.spec import validate_job_spec
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.ceph import REPO, ceph_s3, start_rgw, stop_rgw  # noqa: F401
from tests.pipeline.corpus import docs, job_raw, make_corpus


def test_run_completes_across_an_rgw_restart(ceph_s3, tmp_path, ray_engine):  # noqa: F811
    corpus = make_corpus(tmp_path / "corpus", files=3, per_file=20)
    options = ceph_s3.storage_options()
    lake_root = f"s3://{ceph_s3.new_bucket('restart')}/lake"
    spec = validate_job_spec(job_raw(corpus, lake_root, storage_options=options))
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = run_job(spec, engine=ray_engine)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.5)
    stop_rgw()
    try:
        time.sleep(4)  # the run hits the outage: commits and lease renewals see connection refused
    finally:
        start_rgw()
    worker.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].status == "succeeded"
    lake = Lake(lake_root, storage_options=options)
    ids = lake.read("samples").column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 61
    assert lake.read("runs").column("status").to_pylist() == ["succeeded"]


class _Collector(ThreadingHTTPServer):
    """An OpenLineage HTTP collector on loopback that stops radosgw when a run's START event arrives.

    START is sent after the inputs are listed and before any is read, so the outage lands on the
    reads; radosgw comes back ``outage_s`` later.
    """

    def __init__(self, outage_s: float) -> None:
        self.events: list[str] = []
        self.outage_s = outage_s
        self.stopped_at: float | None = None
        self.restarted_at: float | None = None
        self.errors: list[BaseException] = []
        self.restarter: threading.Thread | None = None
        super().__init__(("127.0.0.1", 0), _CollectorHandler)

    def on_event(self, event_type: str) -> None:
        self.events.append(event_type)
        if event_type == "START" and self.stopped_at is None:
            stop_rgw()
            self.stopped_at = time.monotonic()
            self.restarter = threading.Thread(target=self._restart, daemon=True)
            self.restarter.start()

    def _restart(self) -> None:
        time.sleep(self.outage_s)
        try:
            start_rgw()
            self.restarted_at = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)


class _CollectorHandler(BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        event = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.on_event(event["eventType"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_reading_s3_inputs_survives_an_rgw_restart(ceph_s3, tmp_path, monkeypatch, caplog):  # noqa: F811
    import s3fs

    from datahub.engines.arrow import ArrowEngine

    bucket = ceph_s3.new_bucket("read-restart")
    fs = ceph_s3.filesystem()
    texts = {f"{bucket}/in/part-{f}.jsonl": docs(f"r{f}", 300) for f in range(4)}
    for path, lines in texts.items():
        fs.pipe(path, "".join(json.dumps({"text": t}) + "\n" for t in lines).encode())
    # botocore retries a refused connection itself for about 10 s; turned off here, the outage reaches
    # datahub's own retry, which is what this test is about. A fresh s3fs instance picks the setting up.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()
    collector = _Collector(outage_s=3.0)
    serving = threading.Thread(target=collector.serve_forever, daemon=True)
    serving.start()
    spec = validate_job_spec({
        "name": "rgwread",
        "lake": {"root": str(tmp_path / "lake")},  # a local lake: only the inputs live on Ceph
        "inputs": [{"uri": f"s3://{bucket}/in/*.jsonl", "storage_options": ceph_s3.storage_options()}],
        "graph": {"samples": {"sink": "samples"}},
        "openlineage": {"transport": "http", "url": f"http://127.0.0.1:{collector.server_address[1]}"},
    })
    try:
        with caplog.at_level(logging.WARNING, logger="datahub.retry"):
            result = run_job(spec, engine=ArrowEngine())  # in-process, so the retry's log line is seen here
    finally:
        collector.shutdown()
        if collector.restarter is not None:
            collector.restarter.join(timeout=120)
        start_rgw()  # a no-op when it is up again; never leave the shared endpoint down
        s3fs.S3FileSystem.clear_instance_cache()
    assert not collector.errors, collector.errors
    assert collector.stopped_at is not None and collector.restarted_at is not None  # the outage happened
    assert collector.events == ["START", "COMPLETE"]
    assert result.status == "succeeded"
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"read s3://{bucket}/in/part-0.jsonl: try")]
    assert retries and "try 1/" in retries[0]  # the first file's read hit the outage and was read again
    lake = Lake(str(tmp_path / "lake"))
    samples = lake.read("samples")
    assert lake.read("quarantine").num_rows == 0  # nothing was mistaken for a broken file
    ids = samples.column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 1200
    by_file: dict[str, list[int]] = {}
    for uri, offset in zip(samples.column("source_uri").to_pylist(), samples.column("source_offset").to_pylist()):
        by_file.setdefault(uri, []).append(offset)
    assert {uri: sorted(offsets) for uri, offsets in by_file.items()} == {f"s3://{p}": list(range(1, 301)) for p in texts}
    assert sorted(samples.column("text").to_pylist()) == sorted(t for lines in texts.values() for t in lines)


@pytest.mark.parametrize("name", ["docs.jsonl", "pages.warc.gz"])
def test_a_read_cut_by_an_rgw_restart_resumes_without_duplicates(ceph_s3, tmp_path, monkeypatch, caplog, name):  # noqa: F811
    """The outage hits in the middle of a file: batches already handed on are not produced again."""
    import s3fs

    from datahub.lake.lake import fsspec_options
    from datahub.operator import QUARANTINED
    from datahub.pipeline.ingest import IngestFiles
    from operators.ingest.base import InputFile, detect_format, reader_for
    from operators.ingest.stream import file_identity

    local = tmp_path / name
    if name == "docs.jsonl":  # about 6 MB: the reader's 1 MiB buffer refills from S3 several times
        local.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs("cut", 30_000)))
    else:  # 500 records, about 400 KB: FastWARC pulls 64 KiB at a time
        local.write_bytes((REPO / "data" / "demo" / "pages.warc.gz").read_bytes() * 50)
    bucket = ceph_s3.new_bucket("cut-read")
    fs = ceph_s3.filesystem()
    fs.put_file(str(local), f"{bucket}/{name}")
    size, etag, mtime = file_identity(fs.info(f"{bucket}/{name}"))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # see test_reading_s3_inputs_survives_an_rgw_restart
    s3fs.S3FileSystem.clear_instance_cache()
    options = {**fsspec_options(ceph_s3.storage_options()), "default_block_size": 1 << 16}  # small GETs
    uri = f"s3://{bucket}/{name}"
    file = InputFile(uri=uri, size=size, etag=etag, mtime=mtime, format=detect_format(uri),
                     storage_options=tuple(sorted(options.items())))
    ingest = IngestFiles(run_id="r1", max_record_bytes=100_000, min_text_chars=1, batch_rows=50)
    tables = ingest(file)
    first = next(tables)
    stop_rgw()
    restarter = threading.Timer(3.0, start_rgw)
    restarter.start()
    try:
        with caplog.at_level(logging.WARNING, logger="datahub.retry"):
            rows = pa.concat_tables([first, *tables])
    finally:
        restarter.join()
        start_rgw()  # a no-op when it is up again
        s3fs.S3FileSystem.clear_instance_cache()
    skipped = [int(m.group(1)) for r in caplog.records if (m := re.search(r"skipping the (\d+) items already produced", r.getMessage()))]
    assert skipped and skipped[0] >= 1  # the read broke after batches had been handed on, and resumed
    expected = [b.samples for b in reader_for(file.format)(max_record_bytes=100_000).read(
        InputFile(uri=str(local), size=size, etag="", mtime="", format=file.format))]
    expected_offsets = pa.concat_tables(expected).column("source_offset").to_pylist()
    assert not any(rows.column(QUARANTINED).to_pylist())  # nothing mistaken for a broken record
    assert rows.column("source_offset").to_pylist() == expected_offsets  # each record once, in file order
    assert len(expected_offsets) == (30_000 if name == "docs.jsonl" else 500)
