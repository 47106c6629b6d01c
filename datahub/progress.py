"""Progress of a long pass: ``progress(stage, done, total)`` callbacks, the shape ``run_job``, ``run_suites``,
``build_report`` and the release commands take; the CLI shows them (a bar on a terminal, a log line at most every
10 s off one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Progress = Callable[[str, int, "int | None"], None]  # (stage, rows done, rows in all or None)

Item = TypeVar("Item")


def counted(items: Iterable[Item], progress: Progress | None, stage: str, *, total: int | None,
            rows: Callable[[Item], int]) -> Iterator[Item]:
    """``items`` as they are, reporting ``stage`` at its start and the rows done after each item."""
    if progress is None:
        yield from items
        return
    done = 0
    progress(stage, done, total)
    for item in items:
        yield item
        done += rows(item)
        progress(stage, done, total)
