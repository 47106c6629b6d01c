"""Ends an embedded Ray's processes when the driver that started it dies, kill -9 included.

Ray ties its head processes (gcs_server, raylet) to the driver, but the raylet's agents
(dashboard and runtime-env agents) and idle workers outlived a SIGKILLed driver by one to two
minutes. ``RayEngine.start`` runs this module as a child of the driver with the pids of the
processes ``ray.init`` started: while the driver lives it records their descendants (every
second); once the driver is gone it SIGKILLs every recorded process still running (same pid and
start time, so a reused pid is never hit). Linux only (it reads /proc); pure Python, no Ray import.

    python datahub/engines/ray/watchdog.py DRIVER_PID ROOT_PID...
"""

from __future__ import annotations

import os
import signal
import sys
import time

PROC = "/proc"
POLL_SECONDS = 0.2  # how often the driver is checked
SNAPSHOT_SECONDS = 1.0  # how often Ray's process tree is recorded


def supported() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir(PROC)


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        with open(f"{PROC}/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":  # a zombie is already dead
        return None
    return int(fields[1]), fields[19]


def processes() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (parent pid, start time)."""
    table = {}
    for name in os.listdir(PROC):
        if name.isdigit():
            info = _stat(int(name))
            if info is not None:
                table[int(name)] = info
    return table


def children(pid: int) -> set[int]:
    return {child for child, (parent, _) in processes().items() if parent == pid}


def descendants(roots: set[int]) -> dict[int, str]:
    """``roots`` and all their live descendants: pid -> start time."""
    table = processes()
    found = {pid: table[pid][1] for pid in roots if pid in table}
    frontier = set(found)
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier and pid not in found}
        found.update({pid: table[pid][1] for pid in frontier})
    return found


def kill_recorded(recorded: dict[int, str]) -> int:
    """SIGKILL each recorded process that is still the same process; returns how many."""
    killed = 0
    for pid, started in recorded.items():
        info = _stat(pid)
        if info is not None and info[1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def watch(driver: int, roots: set[int]) -> int:
    recorded: dict[int, str] = {}
    last = 0.0
    while os.getppid() == driver:  # reparented (to init or a subreaper) once the driver is gone
        now = time.monotonic()
        if now - last >= SNAPSHOT_SECONDS:
            current = descendants(roots)
            recorded = {pid: started for pid, started in recorded.items() if _stat(pid) is not None} | current
            last = now
        time.sleep(POLL_SECONDS)
    recorded |= descendants(roots)  # children started since the last snapshot, if their parents still run
    return kill_recorded(recorded)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the driver, which then shuts Ray down itself
    driver, *roots = (int(arg) for arg in argv)
    watch(driver, set(roots))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
