"""A bandwidth cap shared by the threads of one copy: a token bucket (bytes per second, one second of burst)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator


class BandwidthCap:
    """At most ``bytes_per_s`` on average over every caller of ``take``: a caller that overdraws the bucket sleeps
    for its share of the deficit, so parallel copies share the cap instead of each getting it."""

    def __init__(self, bytes_per_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not bytes_per_s > 0:
            raise ValueError(f"a bandwidth cap must be > 0 bytes/s, got {bytes_per_s}")
        self.bytes_per_s = float(bytes_per_s)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._allowance = self.bytes_per_s  # a full bucket: one second of burst
        self._last = clock()

    def take(self, size: int) -> None:
        """Account ``size`` bytes moved; sleeps while the average would go over the cap."""
        with self._lock:
            now = self._clock()
            self._allowance = min(self.bytes_per_s, self._allowance + (now - self._last) * self.bytes_per_s) - size
            self._last = now
            wait = -self._allowance / self.bytes_per_s if self._allowance < 0 else 0.0
        if wait > 0:
            self._sleep(wait)

    def metered(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks``, each accounted before it is handed on."""
        for chunk in chunks:
            self.take(len(chunk))
            yield chunk
