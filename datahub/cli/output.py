"""Shared CLI output helpers: JSON for scripts, rich tables and progress for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str, sort_keys=True) + "\n")


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


@contextmanager
def progress(description: str, *, enabled: bool = True) -> Iterator[Any]:
    """A rich progress display on stderr; yields ``update(stage, done, total)``."""
    if not enabled or not sys.stderr.isatty() and not _force_progress():
        yield lambda stage, done, total=None: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console(stderr=True), transient=True) as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int | None = None) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{description}: {stage}", total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield update


def _force_progress() -> bool:
    import os

    return os.environ.get("DATAHUB_PROGRESS") == "1"
