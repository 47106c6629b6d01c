"""Shared CLI output helpers: JSON for scripts, rich tables and progress for people."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from datahub.settings import progress_forced


def print_json(data: Any) -> None:
    """``data`` as strict JSON: NaN and infinities (not JSON; jq, JSON.parse and Go refuse them) print as null; a
    datetime as ISO 8601 UTC with 'Z' (``lake.timestamps.iso_utc``), the one form of every --json date-time."""
    sys.stdout.write(json.dumps(_finite(data), indent=2, default=_json_value, sort_keys=True, allow_nan=False) + "\n")


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        from datahub.lake.timestamps import iso_utc  # datahub.lake imports pyarrow: not on `datahub --help`

        return iso_utc(value)
    return str(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# Piped output (cron, Airflow, `| less`) has no width: Rich's default of 80 columns wrapped tables and cut
# ids ("stat…"). Wide enough that nothing wraps; a table is as wide as its content.
PIPED_WIDTH = 100_000


def console(stderr: bool = False) -> Any:
    """A Rich console for people: the terminal's width on a TTY, no wrapping when piped."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPED_WIDTH
    return Console(stderr=stderr, highlight=False, width=width, soft_wrap=width is not None)


def fits(out: Any, table: Any) -> bool:
    """Whether ``table`` prints on ``out`` without folding a cell: its natural width is within the console's.
    A table that does not fit folds ids over several lines ("chat- / demo- / 6f4ac") on an 80-column terminal, so
    the commands print such rows as lines instead (piped output has no width and always fits)."""
    return bool(out.measure(table, options=out.options.update_width(PIPED_WIDTH)).maximum <= out.width)


def plain(text: object) -> str:
    """``text`` escaped for Rich markup: error messages and ids print as written (``[a-z]`` stays)."""
    from rich.markup import escape

    return escape(str(text))


@contextmanager
def progress(description: str, *, enabled: bool = True) -> Iterator[Any]:
    """Progress on stderr; yields ``update(stage, done, total)``.

    On a terminal a Rich display; otherwise (cron, Airflow logs) one log line when a stage starts
    and at most one every ``LOG_EVERY_SECONDS`` while it runs, so a long run is never silent. A stage
    is finished when it reaches its total, when the next stage starts, or when the block ends without
    an error: its final count is then shown once (a log line, unless the last one showed it; a bar
    completed at that count).
    """
    if not enabled:
        yield lambda stage, done, total=None: None
        return
    if not sys.stderr.isatty() and not _force_progress():
        lines = _LogLines(description)
        yield lines
        lines.finish()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    # on a narrow terminal the description gives way (cut in its middle), never the stage, the count or the time:
    # at 80 columns `lineage --source PATH: lineage events scanned` hid all three behind "…"
    err = console(stderr=True)
    room = max(MIN_LABEL_WIDTH, err.width - OTHER_COLUMNS_WIDTH)
    text = TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis"))
    with Progress(SpinnerColumn(), text, BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        tasks: dict[str, Any] = {}
        counts: dict[str, int] = {}  # stage -> its last count

        def complete() -> None:
            """Each stage's bar full at its last count (a count of no known total ends ``N/N``, not ``N/?``)."""
            for stage, task in tasks.items():
                bar.update(task, completed=counts[stage], total=counts[stage])

        def update(stage: str, done: int, total: int | None = None) -> None:
            if stage not in tasks:
                complete()  # a new stage: the ones before it are done
                tasks[stage] = bar.add_task(progress_label(description, stage, room), total=total)
            counts[stage] = done
            bar.update(tasks[stage], completed=done, total=total)

        yield update
        complete()
        bar.refresh()


BAR_WIDTH = 20
OTHER_COLUMNS_WIDTH = 50  # spinner, bar, "12345678/12345678", "0:00:00" and the spaces between them
MIN_LABEL_WIDTH = 24


def progress_label(description: str, stage: str, width: int) -> str:
    """``description: stage`` in ``width`` characters: the description is cut in its middle ("lineage --source
    /data/…/part-7.jsonl: rows"), so the stage and the ends of a path stay readable; the stage alone when not even
    8 characters of the description fit."""
    label = f"{description}: {stage}"
    room = width - len(stage) - 3  # ": " and the "…"
    if len(label) <= width:
        return label
    if room < 8:  # no room for a useful part of the description: the stage alone
        return stage
    head = description[:(room + 1) // 2]
    return f"{head}…{description[len(description) - (room - len(head)):]}: {stage}"


def _force_progress() -> bool:
    return progress_forced()


LOG_EVERY_SECONDS = 10.0


class _LogLines:
    """``update(stage, done, total)`` as timestamped lines on stderr, throttled per stage."""

    def __init__(self, description: str) -> None:
        import time

        self.description = description
        self.started = time.monotonic()
        self.last: dict[str, float] = {}  # stage -> when its last line was written
        self.latest: dict[str, tuple[int, int | None]] = {}  # stage -> its last count (done, total)
        self.shown: dict[str, tuple[int, int | None]] = {}  # stage -> the count its last line showed

    def __call__(self, stage: str, done: int, total: int | None = None) -> None:
        import time

        if stage not in self.latest:
            self.finish()  # a new stage: the ones before it are done
        self.latest[stage] = (done, total)
        now = time.monotonic()
        at_total = total is not None and done >= total  # finished: shown at once, once
        if stage in self.last and (self.shown.get(stage) == (done, total) if at_total
                                   else now - self.last[stage] < LOG_EVERY_SECONDS):
            return
        self._write(stage, done, total, now)

    def finish(self) -> None:
        """The final count of each stage whose last line did not show it (throttled): one line each."""
        import time

        for stage, (done, total) in self.latest.items():
            if self.shown.get(stage) != (done, total):
                self._write(stage, done, total, time.monotonic())

    def _write(self, stage: str, done: int, total: int | None, now: float) -> None:
        import time

        self.last[stage] = now
        self.shown[stage] = (done, total)
        clock = time.strftime("%H:%M:%S")
        of = f"/{total}" if total is not None else ""
        sys.stderr.write(f"{clock} {self.description}: {stage} {done}{of} ({now - self.started:.0f}s)\n")
        sys.stderr.flush()
