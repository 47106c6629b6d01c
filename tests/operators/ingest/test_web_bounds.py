"""Web fetches are bounded whatever the server does: by the image's deadline (a server dripping the status line, the
headers, a chunk-size line, the body or a redirect chain), by bytes (a big body or a big redirect body is never read
whole), and by hops (redirects). Loopback servers only; deadlines have wide margins (a 2 s deadline against a server
that would take 60 s, checked with a 30 s join), and byte bounds count what the server managed to send."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from operators.ingest.web import WebImage, fetch_web_image

PICTURE = b"\xff\xd8\xff\xe0" + b"\0" * 1000
DRIP_S = 0.2  # one byte every DRIP_S; 300 bytes: a minute per request
HUGE = 100_000_000  # a body the fetch must never read whole
SENT_BOUND = 20_000_000  # what loopback socket buffers can absorb, with a wide margin (a whole read sends HUGE)


class _Server:
    """A loopback server whose paths script how it misbehaves; records each request's path and the bytes sent."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.paths: list[str] = []
        self.sent = 0
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _drip(self, data: bytes) -> None:
                for byte in data:
                    if server.stop.wait(DRIP_S):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()

            def _stream(self, total: int) -> None:
                block = b"\0" * 65536
                while total > 0 and not server.stop.is_set():
                    self.wfile.write(block[:total])
                    server.sent += min(total, len(block))
                    total -= len(block)

            def _redirect(self, location: str, *, body: int = 0) -> None:
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", str(body))
                self.end_headers()
                self._stream(body)

            def do_GET(self) -> None:
                server.paths.append(self.path)
                name = self.path.lstrip("/")
                try:
                    self._answer(name)
                except OSError:  # the client gave up (its deadline or its byte bound)
                    self.close_connection = True

            def _answer(self, name: str) -> None:
                if name == "drip-status":
                    self.wfile.write(b"HTTP/1.1 200 ")
                    self._drip(b"O" * 300)
                elif name == "drip-headers":  # a 404 cut off at the deadline must not read as image_not_found
                    self.wfile.write(b"HTTP/1.1 404 Not Found\r\nX-Slow: ")
                    self._drip(b"a" * 300)
                elif name == "drip-chunk-size":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;")
                    self._drip(b"x" * 300)
                elif name == "drip-body":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 300\r\n\r\n")
                    self._drip(b"\0" * 300)
                elif name.startswith("slow-hop-"):  # a chain of redirects, each answered after 1.5 s
                    if not server.stop.wait(1.5):
                        self._redirect(f"/slow-hop-{int(name.rsplit('-', 1)[1]) + 1}")
                elif name == "loop":
                    self._redirect("/loop")
                elif name == "redirect-big":
                    self._redirect("/a.jpg", body=HUGE)
                elif name == "utf8-redirect":  # raw UTF-8 in a header, as some servers send it
                    self.wfile.write("HTTP/1.1 302 Found\r\nLocation: /été.jpg\r\nContent-Length: 0\r\n\r\n"
                                     .encode("utf-8"))
                elif name == "to-ftp":
                    self._redirect("ftp://127.0.0.1:9/a.jpg")
                elif name == "big-unsized":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
                    self.close_connection = True
                    self._stream(HUGE)
                elif name == "short":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n")
                    self.wfile.write(b"\xff\xd8" * 250)
                    self.close_connection = True
                else:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(PICTURE)))
                    self.end_headers()
                    self.wfile.write(PICTURE)

        class Server(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        self.httpd = Server((host, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.base = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    served = _Server()
    try:
        yield served
    finally:
        served.close()


def _within(fetch: Callable[[], WebImage], seconds: float = 30.0) -> WebImage:
    """The fetch's result, if it came back within ``seconds`` (a bound far above the deadlines used here)."""
    got: list[WebImage] = []
    worker = threading.Thread(target=lambda: got.append(fetch()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"the fetch was still running after {seconds} s"
    return got[0]


@pytest.mark.parametrize("path", ["drip-status", "drip-headers", "drip-chunk-size", "drip-body", "slow-hop-0"])
def test_a_server_dripping_any_part_of_the_answer_meets_the_image_deadline(server, path):
    """The deadline was checked only between body reads: a status line, header or chunk-size line dripped one byte
    at a time, or a chain of slow redirects, held the reader for as long as the server liked."""
    got = _within(lambda: fetch_web_image(f"{server.base}/{path}", max_bytes=1_000_000, timeout_s=2.0, retries=0))
    assert (got.data, got.reason) == (None, "image_fetch_failed")
    assert got.detail is not None and "timed out" in got.detail


def test_a_redirect_body_is_never_read(server):
    """urllib read a 302's whole body before following it: a 100 MB (or endless) redirect body was held in memory."""
    got = fetch_web_image(f"{server.base}/redirect-big", max_bytes=1_000_000, timeout_s=30.0)
    assert got.data == PICTURE
    assert server.paths == ["/redirect-big", "/a.jpg"]
    assert server.sent < SENT_BOUND


def test_a_body_without_length_is_read_only_up_to_the_limit(server):
    got = fetch_web_image(f"{server.base}/big-unsized", max_bytes=1_000_000, timeout_s=30.0)
    assert (got.data, got.reason) == (None, "oversize")
    assert server.sent < SENT_BOUND


def test_redirects_are_followed_at_most_five_hops_and_only_to_http(server):
    got = fetch_web_image(f"{server.base}/loop", max_bytes=1_000_000)
    assert (got.reason, len(server.paths)) == ("image_fetch_failed", 6)  # the URL and five hops, not tried again
    assert got.detail is not None and "redirects" in got.detail
    server.paths.clear()
    got = fetch_web_image(f"{server.base}/to-ftp", max_bytes=1_000_000)
    assert got.reason == "image_fetch_failed" and got.detail is not None and "ftp://" in got.detail
    assert server.paths == ["/to-ftp"]


def test_urls_with_spaces_and_non_ascii_characters_are_percent_encoded(server):
    """fsspec/aiohttp percent-encoded such URLs; urllib refused them (InvalidURL, UnicodeEncodeError)."""
    for path in ["a b.jpg", "été.jpg", "q.jpg?x=a|b", "done%20already.jpg", "100%.jpg", "5%25%zz.jpg?p=1%"]:
        got = fetch_web_image(f"{server.base}/{path}", max_bytes=1_000_000)
        assert got.data == PICTURE, (path, got)
    assert server.paths == ["/a%20b.jpg", "/%C3%A9t%C3%A9.jpg", "/q.jpg?x=a%7Cb", "/done%20already.jpg",
                            "/100%25.jpg", "/5%25%25zz.jpg?p=1%25"]  # a lone "%" is encoded, as requests does


def test_a_redirect_location_in_raw_utf8_is_followed_as_utf8(server):
    """http.client decodes header values as latin-1: /été.jpg was requested as /%C3%83%C2%A9t%C3%83%C2%A9.jpg."""
    got = fetch_web_image(f"{server.base}/utf8-redirect", max_bytes=1_000_000)
    assert got.data == PICTURE, got
    assert server.paths == ["/utf8-redirect", "/%C3%A9t%C3%A9.jpg"]


def test_an_ipv6_url_without_a_port_connects_to_the_default_port(monkeypatch):
    """http.client read the last ":1" of "::1" as the port when none was given: [::1]/x.jpg never connected."""
    try:
        served = _Server("::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback on this machine: {exc}")
    create_connection = socket.create_connection
    asked: list[tuple[str, int]] = []

    def to_the_test_server(address, *args, **kwargs):  # port 80 needs root: send it to the server's port
        asked.append(address)
        return create_connection(("::1", served.port) if address == ("::1", 80) else address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", to_the_test_server)
    try:
        got = fetch_web_image("http://[::1]/x.jpg", max_bytes=1_000_000, timeout_s=30.0, retries=0)
    finally:
        served.close()
    assert got.data == PICTURE, got
    assert asked == [("::1", 80)] and served.paths == ["/x.jpg"]


def test_a_temporary_name_lookup_failure_is_tried_again(monkeypatch):
    """EAI_AGAIN (a DNS hiccup on a loaded worker) quarantined every URL of a batch at the first try."""
    lookups: list[str] = []

    def hiccup(host, *args, **kwargs):
        lookups.append(host)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", hiccup)
    got = fetch_web_image("http://images.invalid/x.jpg", max_bytes=10, retries=2, backoff_s=0.01)
    assert (got.data, got.reason) == (None, "image_fetch_failed")
    assert got.detail is not None and "after 3 tries" in got.detail, got.detail
    assert lookups == ["images.invalid"] * 3


def test_a_connection_whose_duplicate_fails_is_closed_not_left_for_gc(server, monkeypatch):
    """The watchdog's dup() can fail (out of file descriptors): the connected socket was left open for GC."""
    create_connection = socket.create_connection
    opened: list[socket.socket] = []

    def recorded(*args, **kwargs):
        opened.append(create_connection(*args, **kwargs))
        return opened[-1]

    def no_descriptors(self):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(socket, "create_connection", recorded)
    monkeypatch.setattr(socket.socket, "dup", no_descriptors)
    got = fetch_web_image(f"{server.base}/a.jpg", max_bytes=1_000_000, retries=0)
    assert got.reason == "image_fetch_failed" and got.detail is not None and "Too many open files" in got.detail
    assert len(opened) == 1 and opened[0].fileno() == -1  # closed


def test_a_body_cut_short_is_a_fetch_failure_tried_again_not_an_image(server):
    got = fetch_web_image(f"{server.base}/short", max_bytes=1_000_000, retries=1, backoff_s=0.01)
    assert (got.data, got.reason) == (None, "image_fetch_failed")
    assert got.detail is not None and "500 of 1000 bytes" in got.detail and "after 2 tries" in got.detail
    assert server.paths == ["/short", "/short"]


@pytest.mark.parametrize("url", ["http://127.0.0.1:{closed}/x.jpg", "http://127.0.0.1:99999/x.jpg",
                                 "http://[::1/x.jpg", "ftp://127.0.0.1/x.jpg"])
def test_errors_that_do_not_pass_on_retry_are_not_tried_again(url):
    """Refused connections and invalid URLs (unknown hosts, certificate errors too) were tried three times, with
    sleeps, per record."""
    with socket.socket() as s:  # bound, not listening, for the whole fetch: no other process can take the port
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
        got = fetch_web_image(url.format(closed=closed), max_bytes=10, retries=2, backoff_s=0.01)
    assert (got.data, got.reason) == (None, "image_fetch_failed")
    assert got.detail is not None and "tries" not in got.detail, got.detail
