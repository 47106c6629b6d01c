"""A finished stage shows its final count once (README walkthrough: `evalset check` ended on "rows 5" of 8 rows, its
last, throttled count never printed): one final log line off a terminal, a completed bar on one, nothing with --json."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from datahub.cli.output import progress

REPO = Path(__file__).resolve().parents[2]


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_the_last_throttled_count_of_a_stage_is_logged_when_the_pass_ends(capsys):
    with progress("checking samples") as update:
        update("rows", 5)
        update("rows", 8)  # within LOG_EVERY_SECONDS of the first: throttled
    lines = _lines(capsys)
    assert [line.split(" ", 1)[1].rsplit(" (", 1)[0] for line in lines] == ["checking samples: rows 5",
                                                                             "checking samples: rows 8"]


def test_a_stage_is_logged_final_when_the_next_starts_and_a_count_at_its_total_at_once(capsys):
    with progress("release create v1") as update:
        update("eval-set check", 0, 8)
        update("eval-set check", 5, 8)  # throttled
        update("eval-set check", 8, 8)  # its total: final, shown at once
        update("samples", 0, None)
        update("samples", 4, None)  # throttled, then final when "lineage" starts
        update("lineage", 0, None)
    counts = [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in _lines(capsys)]
    assert counts == ["eval-set check 0/8", "eval-set check 8/8", "samples 0", "samples 4", "lineage 0"]


def test_a_final_count_already_shown_is_not_repeated_and_json_prints_nothing(capsys):
    with progress("qa samples") as update:
        update("rows", 3, 3)
    assert len(_lines(capsys)) == 1
    with progress("qa samples", enabled=False) as update:
        update("rows", 1)
        update("rows", 3)
    assert _lines(capsys) == []


def test_a_failed_pass_does_not_log_a_final_count(capsys):
    try:
        with progress("checking samples") as update:
            update("rows", 5)
            update("rows", 8)
            raise RuntimeError("storage went away")
    except RuntimeError:
        pass
    assert len(_lines(capsys)) == 1


def test_on_a_terminal_the_bar_of_a_finished_stage_completes():
    """A real pseudo-terminal: the bar of a stage with no known total ends at N/N, not N/?."""
    script = ("from datahub.cli.output import progress\n"
              "with progress('checking samples') as update:\n"
              "    update('rows', 5)\n"
              "    update('rows', 8)\n")
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    env.pop("DATAHUB_PROGRESS", None)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=follower, env=env)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower closed: the child is done
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert proc.wait(timeout=120) == 0
    text = shown.decode("utf-8", "replace")
    assert "checking samples: rows" in text and "8/8" in text, text[-500:]
