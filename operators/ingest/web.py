"""Web images (http/https, LAION-style ``url``): one streamed GET per image, never a failed input file.

A web server is not the job's storage: whatever goes wrong with one URL (a 404, a 503, a timeout, a body too big,
a server without Range support) quarantines that record only, with the status or cause in the detail. fsspec's
HTTP file made a HEAD and then ranged GETs (a 5 MB image from a server without Range support raised ValueError
and lost the rest of the refs file; each request had its own timeout), so this is plain ``http.client``: one GET,
redirects followed here (a redirect's body is never read), the size refused from Content-Length before reading, at
most ``max_bytes + 1`` body bytes read, and one deadline for the image enforced on the socket itself (a watchdog
shuts it down), so a server dripping any part of its answer costs at most ``WEB_TIMEOUT_S``.

Not bounded by the deadline: the host name lookup (``getaddrinfo`` cannot be interrupted), and a connect tries
each address of the host with the time left.

Proxy settings (``HTTP_PROXY``, ``HTTPS_PROXY``) are ignored, as fsspec/aiohttp did (``trust_env`` off): every URL
is fetched directly. Credentials in a URL (``user:password@host``) are not sent.
"""

from __future__ import annotations

import functools
import http.client
import io
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

WEB_SCHEMES = ("http://", "https://")
WEB_TIMEOUT_S = 60.0  # one web image: its tries, redirects, waits and reads; aiohttp's default (300 s) stalled readers
WEB_RETRIES = 2  # more tries after a 5xx, a 429, a timeout or a body cut short; nothing else passes on retry
WEB_BACKOFF_S = 0.5  # first wait between tries, doubled after each
WEB_MAX_REDIRECTS = 5  # hops per try (requests allows 30, urllib 10; an image behind more is not worth the wait)
READ_CHUNK_BYTES = 1 << 20
NOT_FOUND_STATUSES = frozenset({404, 410})  # the server says the image is gone: bad data, like a missing file
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# Characters left as they are when a URL is percent-encoded: reserved ones and "%" (already encoded), as requests'
# requote_uri does; a space, a control character or non-ASCII text is encoded (UTF-8), as aiohttp (yarl) did.
_URL_SAFE = "!#$%&'()*+,/:;=?@[]~"
# A "%" that starts no %XX escape ("/100%.jpg") is encoded as %25, as requests does; a valid escape is kept as is.
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class WebImage:
    """What one fetch gave: ``data``, or a quarantine ``reason`` and a ``detail`` naming the status or cause."""

    data: bytes | None
    reason: str | None = None
    detail: str | None = None


def is_web(uri: str) -> bool:
    return uri.lower().startswith(WEB_SCHEMES)


class _Retry(Exception):
    """A failure that may pass on another try (5xx, 429, timeout, body cut short, temporary DNS failure); its text
    is the detail."""


class _Failed(Exception):
    """A failure another try would repeat (refused, unknown host, certificate, invalid URL, too many redirects)."""


def fetch_web_image(url: str, *, max_bytes: int, timeout_s: float = WEB_TIMEOUT_S,
                    retries: int = WEB_RETRIES, backoff_s: float = WEB_BACKOFF_S) -> WebImage:
    """Fetch one web image within ``timeout_s`` (tries, redirects and waits included); never raises for the URL's sake.

    Reasons: ``image_not_found`` (404/410), ``oversize`` (Content-Length or the body > ``max_bytes``, not read
    further), ``image_fetch_failed`` (any other status, a timeout, a body cut short, a dead or unknown host, an
    invalid URL, a redirect loop or a redirect to another scheme; the raw record is kept in the quarantine).
    """
    deadline = time.monotonic() + timeout_s  # one budget for the image, its tries and waits included
    wait = backoff_s
    tries = 0
    while True:
        tries += 1
        try:
            return _follow(url, max_bytes=max_bytes, timeout_s=timeout_s, deadline=deadline)
        except _Failed as exc:
            return WebImage(None, "image_fetch_failed", str(exc))
        except _Retry as exc:
            detail = f"{exc}" if tries == 1 else f"{exc} (after {tries} tries)"
        if tries > retries or time.monotonic() + wait >= deadline:
            return WebImage(None, "image_fetch_failed", detail)
        time.sleep(wait)
        wait *= 2


def _follow(url: str, *, max_bytes: int, timeout_s: float, deadline: float) -> WebImage:
    """One try: the GET and its redirects (each hop's body unread), all under ``deadline``."""
    watchdog = _Watchdog(deadline)
    try:
        target = _encoded(url)
        for _ in range(WEB_MAX_REDIRECTS + 1):
            location = _get(target, max_bytes=max_bytes, timeout_s=timeout_s, deadline=deadline, watchdog=watchdog)
            if isinstance(location, WebImage):
                return location
            target = _encoded(urllib.parse.urljoin(target, _as_utf8(location)))
        raise _Failed(f"more than {WEB_MAX_REDIRECTS} redirects (WEB_MAX_REDIRECTS), the last to {target}")
    finally:
        watchdog.close()


def _as_utf8(header: str) -> str:
    """A header value as UTF-8: ``http.client`` decodes headers as latin-1, servers send UTF-8 (requests'
    ``get_redirect_target`` does the same); the latin-1 text when it is not UTF-8."""
    try:
        return header.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return header


def _quoted(text: str) -> str:
    return urllib.parse.quote(_LONE_PERCENT.sub("%25", text), safe=_URL_SAFE)


def _encoded(url: str) -> str:
    """``url`` percent-encoded (UTF-8) with an IDNA host; only http and https are fetched."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme.lower() not in ("http", "https"):
            raise _Failed(f"{url}: not an http or https URL (redirects to other schemes are refused)")
        host = parts.hostname
        if not host:
            raise _Failed(f"{url}: no host")
        if not host.isascii():
            host = host.encode("idna").decode("ascii")
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:  # raises ValueError for a port out of range
            netloc += f":{parts.port}"
        path = _quoted(parts.path or "/")
        query = _quoted(parts.query)
    except (ValueError, UnicodeError) as exc:
        raise _Failed(f"invalid URL: {type(exc).__name__}: {exc}") from exc
    return urllib.parse.urlunsplit((parts.scheme.lower(), netloc, path, query, ""))


def _get(url: str, *, max_bytes: int, timeout_s: float, deadline: float, watchdog: _Watchdog) -> WebImage | str:
    """One request: the image or a quarantine reason, or a redirect's ``Location`` (its body unread)."""
    parts = urllib.parse.urlsplit(url)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Retry(f"timed out after {timeout_s:g} s (WEB_TIMEOUT_S)")
    # The port is always given: without one, http.client reads the last ":1" of an IPv6 host such as "::1" as the port.
    port = parts.port or (443 if parts.scheme == "https" else 80)
    connection = (http.client.HTTPSConnection(parts.hostname or "", port, timeout=remaining, context=_tls_context())
                  if parts.scheme == "https" else
                  http.client.HTTPConnection(parts.hostname or "", port, timeout=remaining))
    connection._create_connection = watchdog.connect  # type: ignore[attr-defined]  # the socket the watchdog shuts
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request("GET", target, headers={"User-Agent": "datahub-ingest", "Accept-Encoding": "identity"})
        response = connection.getresponse()
        if watchdog.fired:  # a status line or headers cut off at the deadline parse as a short answer
            raise _Retry(f"timed out after {timeout_s:g} s (WEB_TIMEOUT_S) reading the status line and headers")
        status = f"HTTP {response.status} {response.reason}"
        if response.status in REDIRECT_STATUSES:
            location = response.getheader("Location")
            if not location:
                raise _Failed(f"{status} without a Location")
            return location
        if response.status in NOT_FOUND_STATUSES:
            return WebImage(None, "image_not_found", status)
        if response.status >= 500 or response.status == 429:
            raise _Retry(status)
        if not 200 <= response.status < 300:
            return WebImage(None, "image_fetch_failed", status)
        return _body(response, max_bytes=max_bytes, timeout_s=timeout_s, watchdog=watchdog)
    except (_Retry, _Failed):
        raise
    except Exception as exc:  # noqa: BLE001 -- sorted into what passes on retry and what does not
        if watchdog.fired or isinstance(exc, (TimeoutError, socket.timeout)):
            raise _Retry(f"timed out after {timeout_s:g} s (WEB_TIMEOUT_S): {type(exc).__name__}") from exc
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
                            http.client.IncompleteRead)):  # the connection dropped: the next one may hold
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(exc, socket.gaierror) and exc.errno == socket.EAI_AGAIN:  # "temporary failure in name resolution"
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(exc, (OSError, http.client.HTTPException, ValueError, UnicodeError)):
            # refused, unknown host, certificate, invalid URL or status line: a retry gives the same answer
            raise _Failed(f"{type(exc).__name__}: {exc}") from exc
        raise
    finally:
        connection.close()


def _body(response: http.client.HTTPResponse, *, max_bytes: int, timeout_s: float, watchdog: _Watchdog) -> WebImage:
    """The body, refused from Content-Length or after ``max_bytes + 1`` bytes; a body cut short is a retry."""
    length_header = response.getheader("Content-Length")
    length = int(length_header) if length_header is not None and length_header.strip().isdigit() else None
    if length is not None and length > max_bytes:
        return WebImage(None, "oversize", f"image of {length} bytes (Content-Length) > max_record_bytes={max_bytes}, "
                        "not read")
    body = io.BytesIO()  # getvalue() hands over its buffer: the body is held once
    size = 0
    while size <= max_bytes:
        chunk = response.read1(min(READ_CHUNK_BYTES, max_bytes + 1 - size))  # one recv at most
        if not chunk:
            break
        body.write(chunk)
        size += len(chunk)
    if watchdog.fired:  # the socket was shut at the deadline: what was read is not the whole body
        raise _Retry(f"timed out after {timeout_s:g} s (WEB_TIMEOUT_S) reading the body")
    if size > max_bytes:
        return WebImage(None, "oversize", f"image of more than {max_bytes} bytes > max_record_bytes={max_bytes}, "
                        "not read further")
    if length is not None and size < length:  # read1 gives b"" at an early end, it does not raise IncompleteRead
        raise _Retry(f"IncompleteRead: {size} of {length} bytes (Content-Length)")
    return WebImage(body.getvalue())


class _Watchdog:
    """Shuts the current connection's socket down at the deadline, whatever ``http.client`` is blocked in.

    The socket timeout bounds each recv only; a server sending a byte now and then (status line, headers, chunk-size
    lines, body) resets it each time. A shut socket makes the blocked read return at once. The watchdog holds a
    duplicate of the socket, so a TLS wrap or a close by ``http.client`` never leaves it shutting a reused fd.
    """

    def __init__(self, deadline: float) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self.fired = False
        self._timer = threading.Timer(max(deadline - time.monotonic(), 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def connect(self, address: tuple[str, int], timeout: float | None = None,
                source_address: tuple[str, int] | None = None) -> socket.socket:
        """``socket.create_connection``, the new socket watched (the previous hop's released)."""
        connected = socket.create_connection(address, timeout, source_address)
        with self._lock:
            self._release()
            try:
                self._socket = connected.dup()
            except OSError:  # out of file descriptors: the connection is not handed on, so close it here
                connected.close()
                raise
            if self.fired:
                self._shut()
        return connected

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            self._shut()

    def _shut(self) -> None:
        if self._socket is not None:
            try:
                self._socket.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by the peer
                pass

    def _release(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._release()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One default context per process (loading the CA store per image costs milliseconds)."""
    return ssl.create_default_context()
