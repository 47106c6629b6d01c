"""Web images: one streamed GET per image on a loopback server; every failure quarantines that record only."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from operators.ingest.base import InputFile, reader_for
from operators.ingest.web import fetch_web_image
from tests.operators.media.conftest import image_of, shard_members

BIG = b"\xff\xd8\xff" + b"\0" * 6_000_000  # over fsspec's 5 MB block: a server without Range support broke the file


class _Server:
    """A loopback HTTP/1.0 server without Range support; records each request's method and path."""

    def __init__(self, picture: bytes) -> None:
        self.picture = picture
        self.requests: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.hanging = threading.Event()  # set once a hang.jpg request is recorded (the client may time out first)
        self.flaky_served = False
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                server.requests.append(("HEAD", self.path))
                self.send_response(405)
                self.end_headers()

            def do_GET(self) -> None:
                server.requests.append(("GET", self.path))
                name = self.path.rsplit("/", 1)[-1]
                if name == "hang.jpg":
                    server.hanging.set()
                    server.release.wait(30)
                    return
                if name == "flaky.jpg" and not server.flaky_served:
                    server.flaky_served = True
                    name = "503.jpg"
                status = int(name.split(".")[0]) if name.split(".")[0].isdigit() else 200
                if status != 200:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = BIG if name.startswith("big") else server.picture
                self.send_response(200)
                if name != "big-unsized.jpg":  # no Content-Length: the body is read only up to the limit
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # the reader stopped reading an oversize body
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    served = _Server(image_of(shard_members()["img00000"]))
    try:
        yield served
    finally:
        served.close()


def _read(path: Path, max_record_bytes: int) -> tuple[pa.Table, pa.Table]:
    file = InputFile(uri=str(path), size=path.stat().st_size, etag="", mtime="", format="jsonl",
                     text_field="caption", kind="image_text")
    batches = list(reader_for("jsonl", "image_text")(max_record_bytes=max_record_bytes, batch_rows=16).read(file))
    return (pa.concat_tables([b.samples for b in batches]), pa.concat_tables([b.quarantine for b in batches]))


def test_a_big_image_from_a_server_without_ranges_quarantines_its_record_not_the_refs_file(tmp_path, server):
    """A 6 MB image from a server without Range support raised fsspec's ValueError out of fetch: the whole refs
    file became one unreadable_file row and the records after it were lost. Now each record is accounted for."""
    names = ["a.jpg", "big.jpg", "big-unsized.jpg", "410.jpg", "403.jpg", "flaky.jpg", "a.jpg"]
    path = tmp_path / "refs.jsonl"
    path.write_text("".join(json.dumps({"url": f"{server.base}/{n}", "caption": f"c{i}"}) + "\n"
                            for i, n in enumerate(names)))
    samples, bad = _read(path, max_record_bytes=1_000_000)
    assert samples.column("text").to_pylist() == ["c0", "c5", "c6"]
    rows = {r["source_offset"]: (r["reason"], r["detail"]) for r in bad.to_pylist()}
    assert sorted(rows) == [2, 3, 4, 5]
    assert rows[2][0] == "oversize" and "6000003 bytes (Content-Length)" in rows[2][1]
    assert rows[3][0] == "oversize" and "not read further" in rows[3][1]
    assert rows[4] == ("image_not_found", f"record 4: {server.base}/410.jpg: HTTP 410 Gone")
    assert rows[5] == ("image_fetch_failed", f"record 5: {server.base}/403.jpg: HTTP 403 Forbidden")
    assert {method for method, _ in server.requests} == {"GET"}  # no HEAD, no ranged reads
    assert [p for _, p in server.requests].count("/flaky.jpg") == 2  # a 503, then served on the retry


@pytest.mark.parametrize("status, reason", [(500, "image_fetch_failed"), (503, "image_fetch_failed"),
                                            (429, "image_fetch_failed"), (401, "image_fetch_failed"),
                                            (404, "image_not_found")])
def test_each_status_has_its_reason_and_only_5xx_and_429_are_tried_again(server, status, reason):
    got = fetch_web_image(f"{server.base}/{status}.jpg", max_bytes=1_000_000, retries=2, backoff_s=0.01)
    assert (got.data, got.reason) == (None, reason)
    assert got.detail is not None and got.detail.startswith(f"HTTP {status} ")
    tries = 3 if status >= 500 or status == 429 else 1
    assert len(server.requests) == tries
    assert (f"after {tries} tries" in got.detail) == (tries > 1)


def test_a_hanging_host_costs_one_request_within_the_image_timeout(server):
    """fsspec made a HEAD and then a GET, each with the full timeout: a hanging host cost twice WEB_TIMEOUT_S."""
    got = fetch_web_image(f"{server.base}/hang.jpg", max_bytes=1_000_000, timeout_s=3.0, backoff_s=0.01)
    assert (got.data, got.reason) == (None, "image_fetch_failed")
    assert got.detail is not None and "timed out" in got.detail
    assert server.hanging.wait(30)  # the handler thread may record the request after the client gave up
    assert server.requests == [("GET", "/hang.jpg")]


def test_a_dead_host_is_a_fetch_failure_naming_the_cause():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    got = fetch_web_image(f"http://127.0.0.1:{closed}/x.jpg", max_bytes=10, retries=1, backoff_s=0.01)
    assert got.reason == "image_fetch_failed" and got.detail is not None and "ConnectionRefusedError" in got.detail
