"""Retry with exponential backoff, for transient failures only.

Whether to retry depends on the exception class (``datahub.errors.TransientError``), never
on message text. The one exception to that rule is at the storage boundary:
``storage_errors`` turns the errors of delta-rs (``OSError`` whose message carries the
object_store cause), s3fs/botocore and the socket layer that mean "try again" (connection
refused or reset, timeouts, HTTP 5xx, throttling) into ``StorageError``, so every caller above
decides by class.
"""

from __future__ import annotations

import logging
import random
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from datahub.errors import StorageError, TerminalError, TransientError

T = TypeVar("T")
log = logging.getLogger(__name__)

# delta-rs reports object_store failures as OSError with the causal chain in the message;
# these fragments are the transport / server-side causes (object_store's RetryError chain).
_TRANSIENT_TEXT = re.compile(
    r"connection refused|connection reset|broken pipe|error sending request|tcp connect error|"
    r"timed out|timeout error|temporarily unavailable|service unavailable|slow ?down|internal ?error|"
    r"bad gateway|gateway time|server error|status:? 50[0-4]|dns error|unexpected eof|incomplete message|"
    r"connection closed",
    re.IGNORECASE,
)
_TRANSIENT_CLASS_NAMES = {
    # botocore / aiohttp / urllib3 classes, matched by name so this module imports none of them
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ClientConnectorError", "ServerDisconnectedError", "ClientOSError", "ServerTimeoutError",
    "ProtocolError", "NewConnectionError", "ResponseStreamingError",
}


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry: ``attempts`` tries, sleeping ``backoff * 2**n`` (capped, jittered)."""

    attempts: int = 8
    backoff: float = 0.5
    max_backoff: float = 10.0
    jitter: float = 0.1  # fraction of each sleep, so concurrent writers do not retry in lockstep


DEFAULT_POLICY = RetryPolicy()  # about 40 s of patience: a radosgw restart takes 5-15 s here


def is_transient_storage_error(exc: BaseException) -> bool:
    """True for storage failures that may go away when retried (see the module docstring)."""
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, TerminalError):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
        return True
    if any(cls.__name__ in _TRANSIENT_CLASS_NAMES for cls in type(exc).__mro__):
        return True
    status = _http_status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if isinstance(exc, OSError) and type(exc).__name__ not in ("FileNotFoundError", "PermissionError"):
        return bool(_TRANSIENT_TEXT.search(str(exc)))
    # delta-rs raises DeltaError (not OSError) when uploading a data file fails after object_store's own retries
    if any(cls.__name__ == "DeltaError" for cls in type(exc).__mro__) and _TRANSIENT_TEXT.search(str(exc)):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_transient_storage_error(cause)


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status else None
    return None


@contextmanager
def storage_errors(where: str) -> Iterator[None]:
    """Re-raise transient storage failures inside the block as ``StorageError`` naming ``where``."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        if isinstance(exc, TransientError) or not is_transient_storage_error(exc):
            raise
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"{where}: storage did not answer ({type(exc).__name__}: {first_line}); retrying may succeed") from exc


def retry(
    fn: Callable[[], T],
    *,
    attempts: int = DEFAULT_POLICY.attempts,
    backoff: float = DEFAULT_POLICY.backoff,
    max_backoff: float = DEFAULT_POLICY.max_backoff,
    jitter: float = DEFAULT_POLICY.jitter,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` until it returns, retrying ``TransientError`` up to ``attempts`` tries in all.

    Any other exception propagates at once; after the last try the transient error does too.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except TransientError as exc:
            if attempt == attempts:
                raise
            delay = _delay(attempt, backoff, max_backoff, jitter)
            log.warning("attempt %d/%d failed (%s); retrying in %.1fs", attempt, attempts, exc, delay)
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            sleep(delay)
    raise AssertionError("unreachable")


def _delay(attempt: int, backoff: float, max_backoff: float, jitter: float) -> float:
    """Sleep before try ``attempt + 1``: ``backoff * 2**(attempt-1)``, capped, jittered."""
    return min(max_backoff, backoff * 2 ** (attempt - 1)) * (1 + random.uniform(-jitter, jitter))


def retry_stream(
    start: Callable[[], Iterable[T]],
    policy: RetryPolicy = DEFAULT_POLICY,
    *,
    where: str,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[T]:
    """Yield the items of ``start()``; after a ``TransientError`` call ``start()`` again and skip
    the items already yielded, so each item comes out exactly once however often the stream broke.

    Only for deterministic streams: the same source must give the same items in the same order
    (a reader re-reading an unchanged file). Gives up after ``policy.attempts`` tries in a row
    that yield nothing new; a try that gets further than any before starts the count again,
    so a long read survives several separate outages.
    """
    yielded = 0  # items handed out so far
    failures = 0  # tries in a row that ended in a transient error without new items
    while True:
        mark, position = yielded, 0
        try:
            for item in start():
                position += 1
                if position > yielded:
                    yielded = position
                    yield item
            return
        except TransientError as exc:
            failures = 1 if yielded > mark else failures + 1
            if failures >= policy.attempts:
                raise
            delay = _delay(failures, policy.backoff, policy.max_backoff, policy.jitter)
            log.warning("%s: try %d/%d failed (%s); reading again from the start in %.1fs, skipping the %d items "
                        "already produced", where, failures, policy.attempts, exc, delay, yielded)
            if on_retry is not None:
                on_retry(failures, exc, delay)
            sleep(delay)


def retry_policy(fn: Callable[[], T], policy: RetryPolicy, *,
                 on_retry: Callable[[int, BaseException, float], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``retry`` with the numbers taken from ``policy``."""
    return retry(fn, attempts=policy.attempts, backoff=policy.backoff, max_backoff=policy.max_backoff,
                 jitter=policy.jitter, on_retry=on_retry, sleep=sleep)
