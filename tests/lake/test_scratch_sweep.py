"""Spill folders of killed processes are removed by the next one made (datahub.lake.scratch).

A redact by a take-down list of 40M ids spills 1-3 GB of sorted ids; a release merge or create sorts its ids in
runs on local disk. kill -9 skips every cleanup, so before these folders were locked, each killed command left its
spill in TMPDIR for good. A folder whose process still runs holds its lock and is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


from tests.pipeline.corpus import REPO

SORT_PREFIX = "datahub-sort-"  # datahub.lake.external_sort.SORT_PREFIX
IDS_PREFIX = "datahub-ids-"  # datahub.release.lookup.IDS_PREFIX

SORT = """
import os, signal, sys, time
import pyarrow as pa
from datahub.lake.external_sort import SortedRuns

runs = SortedRuns(pa.schema([("k", pa.string())]), "k", run_rows=2, directory=sys.argv[1])
runs.add(pa.table({"k": ["c", "b", "a", "d"]}))  # two runs spilled
assert runs.spilled_runs >= 1
print("spilled", flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(600)
"""

IDS = """
import os, signal, sys, time
import pyarrow as pa
from datahub.release.lookup import SortedIds

ids = SortedIds(run_rows=2)
ids.add(pa.array(["c", "b", "a", "d"]))
ids.seal()
print("sealed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _start(script: str, *args: str, tmpdir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmpdir)}
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, env=env)


def _folders(parent: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(prefix))


def test_a_killed_sorts_runs_are_removed_by_the_next_sort_and_a_running_ones_kept(tmp_path: Path) -> None:
    import pyarrow as pa

    from datahub.lake.external_sort import SortedRuns

    killed = _start(SORT, str(tmp_path), "kill", tmpdir=tmp_path)
    assert killed.stdout is not None and killed.stdout.readline().strip() == "spilled"
    assert killed.wait(timeout=60) == -signal.SIGKILL
    left = _folders(tmp_path, SORT_PREFIX)
    assert len(left) == 1
    live = _start(SORT, str(tmp_path), "live", tmpdir=tmp_path)
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == "spilled"
        running = _folders(tmp_path, SORT_PREFIX)
        assert len(running) == 1 and running != left  # the killed sort's removed by the next sort's spill
        with SortedRuns(pa.schema([("k", pa.string())]), "k", run_rows=2, directory=str(tmp_path)) as runs:
            runs.add(pa.table({"k": ["z", "y", "x"]}))
            assert [k for t in runs.merged() for k in t.column("k").to_pylist()] == ["x", "y", "z"]
            now = _folders(tmp_path, SORT_PREFIX)
            assert len(now) == 2 and set(running) < set(now)  # a running sort's folder is kept
        assert _folders(tmp_path, SORT_PREFIX) == running
    finally:
        live.kill()
        live.wait()


def test_a_killed_redacts_sorted_ids_are_removed_by_the_next_one(tmp_path: Path, monkeypatch) -> None:
    import pyarrow as pa

    from datahub.release.lookup import SortedIds

    killed = _start(IDS, tmpdir=tmp_path)
    assert killed.stdout is not None and killed.stdout.readline().strip() == "sealed"
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert len(_folders(tmp_path, IDS_PREFIX)) == 1
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with SortedIds(run_rows=2) as ids:
        ids.add(pa.array(["q", "p"]))
        ids.seal()
        assert [i for a in ids.blocks() for i in a.to_pylist()] == ["p", "q"]
        assert len(_folders(tmp_path, IDS_PREFIX)) == 1  # its own; the killed one's removed
    assert _folders(tmp_path, IDS_PREFIX) == []


def test_a_process_sweeps_a_prefix_once_and_the_next_process_what_was_killed_meanwhile(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """Every sort or lookup used to list its parent folder (TMPDIR: may be large) for stale folders at its first
    spill; now a process lists each prefix's parent once. A process killed before that sweep is cleaned up by it; one
    killed after it, by the next process that spills there."""
    import pyarrow as pa

    from datahub.lake.external_sort import SortedRuns
    from datahub.lake.scratch import HeldScratch

    listed: list[str] = []
    real_listdir = os.listdir

    def counting_listdir(path: str = ".") -> list[str]:
        if os.path.realpath(path) == os.path.realpath(tmp_path):
            listed.append(path)
        return real_listdir(path)

    def killed_sort() -> str:
        child = _start(SORT, str(tmp_path), "kill", tmpdir=tmp_path)
        assert child.stdout is not None and child.stdout.readline().strip() == "spilled"
        assert child.wait(timeout=60) == -signal.SIGKILL
        return (set(_folders(tmp_path, SORT_PREFIX)) - before).pop()

    def sort_here() -> None:
        with SortedRuns(pa.schema([("k", pa.string())]), "k", run_rows=2, directory=str(tmp_path)) as runs:
            runs.add(pa.table({"k": ["c", "b", "a"]}))
            assert [k for t in runs.merged() for k in t.column("k").to_pylist()] == ["a", "b", "c"]

    before: set[str] = set()
    first = killed_sort()
    monkeypatch.setattr(os, "listdir", counting_listdir)
    for _ in range(3):
        sort_here()
    assert len(listed) == 1  # at the first sort only
    HeldScratch("datahub-other-", parent=str(tmp_path)).close()  # another prefix: swept once too
    HeldScratch("datahub-other-", parent=str(tmp_path)).close()
    assert len(listed) == 2
    monkeypatch.undo()
    assert _folders(tmp_path, SORT_PREFIX) == []  # the killed sort's removed by the first sweep
    second = killed_sort()
    assert second != first
    sort_here()
    assert _folders(tmp_path, SORT_PREFIX) == [second]  # killed after this process's sweep: left to the next one
    live = _start(SORT, str(tmp_path), "live", tmpdir=tmp_path)
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == "spilled"
        running = _folders(tmp_path, SORT_PREFIX)
        assert len(running) == 1 and running != [second]  # the next process swept it
    finally:
        live.kill()
        live.wait()


def test_a_long_lived_process_sweeps_again_once_ten_minutes_have_passed(tmp_path: Path, monkeypatch) -> None:
    """A reused Ray worker or a service spills again and again in one process: a sort killed after its first sweep
    stays while this process's sweep is recent (one listdir per SWEEP_AGAIN_S), and its next spill once that time
    has passed (a patched monotonic clock, no sleeps) removes it; a running sort's folder is still kept."""
    import pyarrow as pa

    from datahub.lake import scratch
    from datahub.lake.external_sort import SortedRuns

    now = [1000.0]
    monkeypatch.setattr(scratch, "_clock", lambda: now[0])
    swept: list[list[str]] = []  # what each sweep of this process removed
    real_sweep = scratch.sweep_stale

    def counting_sweep(prefix: str, *, parent: str | None = None) -> list[str]:
        swept.append([os.path.basename(p) for p in real_sweep(prefix, parent=parent)])
        return swept[-1]

    def sort_here() -> None:
        with SortedRuns(pa.schema([("k", pa.string())]), "k", run_rows=2, directory=str(tmp_path)) as runs:
            runs.add(pa.table({"k": ["c", "b", "a"]}))
            assert [k for t in runs.merged() for k in t.column("k").to_pylist()] == ["a", "b", "c"]

    monkeypatch.setattr(scratch, "sweep_stale", counting_sweep)
    sort_here()
    assert swept == [[]]
    killed = _start(SORT, str(tmp_path), "kill", tmpdir=tmp_path)
    assert killed.stdout is not None and killed.stdout.readline().strip() == "spilled"
    assert killed.wait(timeout=60) == -signal.SIGKILL
    left = _folders(tmp_path, SORT_PREFIX)
    assert len(left) == 1
    now[0] += scratch.SWEEP_AGAIN_S - 1
    sort_here()
    assert len(swept) == 1 and _folders(tmp_path, SORT_PREFIX) == left  # swept less than ten minutes ago
    with SortedRuns(pa.schema([("k", pa.string())]), "k", run_rows=2, directory=str(tmp_path)) as held:
        held.add(pa.table({"k": ["z", "y", "x"]}))  # a sort still running (its folder locked) while the next sweeps
        running = sorted(set(_folders(tmp_path, SORT_PREFIX)) - set(left))
        assert len(running) == 1
        now[0] += 2
        sort_here()
        assert swept[1:] == [left]  # ten minutes since the last sweep: swept again
        assert _folders(tmp_path, SORT_PREFIX) == running  # the killed sort's removed, the running one's kept
        sort_here()
        assert len(swept) == 2  # and not again before ten more minutes
    assert _folders(tmp_path, SORT_PREFIX) == []
