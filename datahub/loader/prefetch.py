"""Read shards ahead of the consumer on a few threads, holding at most ``depth`` shards not yet taken."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any
from concurrent.futures import Future, ThreadPoolExecutor


class Prefetcher:
    """``schedule`` shard ids in the order they will be ``take``n; reads run on threads (I/O and sha256 drop the GIL)."""

    def __init__(self, read: Callable[[int], Any], *, depth: int = 2, threads: int = 2) -> None:
        self._read = read
        self._depth = max(0, depth)
        self._queue: deque[int] = deque()
        self._futures: dict[int, Future[Any]] = {}
        self._pool = ThreadPoolExecutor(max(1, min(threads, self._depth)), thread_name_prefix="datahub-prefetch") if self._depth else None

    def schedule(self, shard_ids: Iterable[int]) -> None:
        self._queue.extend(shard_ids)
        self._fill()

    def _fill(self) -> None:
        while self._pool is not None and self._queue and len(self._futures) < self._depth:
            shard = self._queue.popleft()
            if shard not in self._futures:
                self._futures[shard] = self._pool.submit(self._read, shard)

    def take(self, shard: int) -> Any:
        future = self._futures.pop(shard, None)
        if future is None:
            try:
                self._queue.remove(shard)
            except ValueError:
                pass
            data = self._read(shard)
        else:
            data = future.result()
        self._fill()
        return data

    def close(self) -> None:
        self._queue.clear()
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
