"""Web images (http/https, LAION-style ``url``): one streamed GET per image, never a failed input file.

A web server is not the job's storage: whatever goes wrong with one URL (a 404, a 503, a timeout, a body too big,
a server without Range support) quarantines that record only, with the status or cause in the detail. fsspec's
HTTP file made a HEAD and then ranged GETs (a 5 MB image from a server without Range support raised ValueError
and lost the rest of the refs file; each request had its own timeout), so this is plain ``urllib``: one GET, the
size refused from Content-Length before reading, at most ``max_bytes + 1`` bytes read.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

WEB_SCHEMES = ("http://", "https://")
WEB_TIMEOUT_S = 60.0  # one web image, all of its requests and reads; aiohttp's default (300 s) stalled readers
WEB_RETRIES = 2  # more tries after a 5xx, a 429, a timeout or a dropped connection (img2dataset retries too)
WEB_BACKOFF_S = 0.5  # first wait between tries, doubled after each
READ_CHUNK_BYTES = 1 << 20
NOT_FOUND_STATUSES = frozenset({404, 410})  # the server says the image is gone: bad data, like a missing file


@dataclass(frozen=True)
class WebImage:
    """What one fetch gave: ``data``, or a quarantine ``reason`` and a ``detail`` naming the status or cause."""

    data: bytes | None
    reason: str | None = None
    detail: str | None = None


def is_web(uri: str) -> bool:
    return uri.lower().startswith(WEB_SCHEMES)


class _Retry(Exception):
    """A failure worth another try (5xx, 429, timeout, connection); its text is the quarantine detail."""


# No proxies from the environment (fsspec's HTTP client took none either), redirects followed.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch_web_image(url: str, *, max_bytes: int, timeout_s: float = WEB_TIMEOUT_S,
                    retries: int = WEB_RETRIES, backoff_s: float = WEB_BACKOFF_S) -> WebImage:
    """Fetch one web image; never raises for the URL's sake.

    Reasons: ``image_not_found`` (404/410), ``oversize`` (Content-Length or the body > ``max_bytes``, not read
    further), ``image_fetch_failed`` (any other status, a timeout, a dead host: worth ingesting again later).
    """
    deadline = time.monotonic() + timeout_s  # one budget for the image, its tries and waits included
    wait = backoff_s
    tries = 0
    while True:
        tries += 1
        try:
            return _get(url, max_bytes=max_bytes, timeout_s=timeout_s, deadline=deadline)
        except _Retry as exc:
            detail = f"{exc}" if tries == 1 else f"{exc} (after {tries} tries)"
        if tries > retries or time.monotonic() + wait >= deadline:
            return WebImage(None, "image_fetch_failed", detail)
        time.sleep(wait)
        wait *= 2


def _get(url: str, *, max_bytes: int, timeout_s: float, deadline: float) -> WebImage:
    request = urllib.request.Request(url, headers={"User-Agent": "datahub-ingest", "Accept-Encoding": "identity"})
    try:
        with _OPENER.open(request, timeout=max(deadline - time.monotonic(), 0.001)) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > max_bytes:
                return WebImage(None, "oversize", f"image of {int(length)} bytes (Content-Length) > "
                                f"max_record_bytes={max_bytes}, not read")
            chunks: list[bytes] = []
            size = 0
            while size <= max_bytes:
                if time.monotonic() > deadline:
                    raise _Retry(f"timed out after {timeout_s:g} s (WEB_TIMEOUT_S) reading the body")
                # read1: one recv at most, so a server dripping bytes meets the deadline check
                chunk = response.read1(min(READ_CHUNK_BYTES, max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > max_bytes:
                return WebImage(None, "oversize", f"image of more than {max_bytes} bytes > "
                                f"max_record_bytes={max_bytes}, not read further")
            return WebImage(b"".join(chunks))
    except urllib.error.HTTPError as exc:
        status = f"HTTP {exc.code} {exc.reason}"
        exc.close()
        if exc.code in NOT_FOUND_STATUSES:
            return WebImage(None, "image_not_found", status)
        if exc.code >= 500 or exc.code == 429:
            raise _Retry(status) from exc
        return WebImage(None, "image_fetch_failed", status)
    except (TimeoutError, socket.timeout) as exc:
        raise _Retry(f"timed out after {timeout_s:g} s (WEB_TIMEOUT_S): {exc}") from exc
    except urllib.error.URLError as exc:  # DNS, refused, TLS: the reason is the cause
        cause = exc.reason
        if isinstance(cause, (TimeoutError, socket.timeout)):
            raise _Retry(f"timed out after {timeout_s:g} s (WEB_TIMEOUT_S): {cause}") from exc
        raise _Retry(f"{type(cause).__name__}: {cause}") from exc
    except (http.client.HTTPException, ConnectionError, OSError) as exc:  # dropped mid-body, bad status line
        raise _Retry(f"{type(exc).__name__}: {exc}") from exc
    except ValueError as exc:  # a URL urllib cannot parse: trying again will not help
        return WebImage(None, "image_fetch_failed", f"{type(exc).__name__}: {exc}")
