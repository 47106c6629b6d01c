"""On an 80-column terminal the wide tables of `datahub runs` and `datahub lineage --source` folded their ids over
several lines ("small- / 3f2a9 / ..."), so a run id or sample id could not be copied whole; they now print their rows
as lines when the table does not fit. Run on a real pseudo-terminal: piped output never wraps (test_newcomer.py)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

from tests.cli.conftest import REPO


def on_a_terminal(*args: str, columns: int = 80) -> str:
    """The CLI's output on a pseudo-terminal ``columns`` wide, without colour and cursor codes."""
    return _on_a_terminal(["-m", "datahub.cli.main", *args], columns)


def _on_a_terminal(argv: list[str], columns: int) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm", "RAY_AUTH_MODE": "disabled"}
    env.pop("DATAHUB_PROGRESS", None)
    proc = subprocess.Popen([sys.executable, *argv], stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=env)
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                raise TimeoutError(f"{' '.join(argv)}: no output for 120 s")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        assert proc.wait(timeout=120) == 0, b"".join(chunks).decode("utf-8", "replace")
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r", "")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_run_and_sample_ids_print_whole_on_an_80_column_terminal(small_lake):
    from datahub.lake import Lake

    lake = Lake(str(small_lake))
    (run_id,) = lake.read("runs", columns=["run_id"]).column("run_id").to_pylist()
    runs = on_a_terminal("runs", "--lake", str(small_lake))
    assert "duration" not in runs, runs
    assert any(run_id in line and "succeeded" in line for line in runs.splitlines()), runs
    assert all(len(line) <= 80 for line in runs.splitlines() if "succeeded" in line), runs

    ids = lake.read("samples", columns=["sample_id"]).column("sample_id").to_pylist()
    story = on_a_terminal("lineage", "--source", str(small_lake.parent / "a.jsonl"), "--lake", str(small_lake))
    lines = story.splitlines()
    for sample_id in ids:
        assert any(sample_id in line and "kept" in line for line in lines), story


def test_a_wide_terminal_keeps_the_tables(small_lake):
    runs = on_a_terminal("runs", "--lake", str(small_lake), columns=200)
    assert "duration" in runs and "started" in runs, runs  # the table's headers (the lines have neither)


def test_a_progress_bar_on_an_80_column_terminal_shows_its_stage_and_count():
    """`lineage --source PATH` (or any long description) hid the stage, the count and the time behind "…"."""
    script = ("import time\n"
              "from datahub.cli.output import progress\n"
              "with progress('lineage --source /work/main/data/posttraining/chat-openai.jsonl') as update:\n"
              "    update('lineage events scanned', 32768)\n"
              "    time.sleep(0.5)\n")
    shown = _on_a_terminal(["-c", script], 80)
    assert "lineage events scanned" in shown and "32768/32768" in shown, shown[-800:]


def test_a_progress_label_is_cut_in_the_description_never_the_stage():
    from datahub.cli.output import progress_label

    description = "lineage --source /data/raw/2026-12/part-00007.jsonl.gz"
    assert progress_label(description, "rows", 200) == f"{description}: rows"
    cut = progress_label(description, "rows", 40)
    assert len(cut) == 40 and cut.endswith(".jsonl.gz: rows") and cut.startswith("lineage --source") and "…" in cut
    assert progress_label(description, "lineage events scanned", 30) == "lineage events scanned"
