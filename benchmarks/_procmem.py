"""Run a command and sample the peak memory of its whole process tree (driver, raylet, JVM, workers).

Memory is the summed PSS (proportional set size, /proc/PID/smaps_rollup) of the tree: pages
shared between processes (Ray's object store in /dev/shm, forked workers) count once in
total, where summed RSS would count them once per process. Sampled every 100 ms.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError):
            continue
    return children


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pss(root: int) -> int:
    """Summed PSS bytes of ``root`` and all its descendants."""
    children, total, stack = _children(), 0, [root]
    while stack:
        pid = stack.pop()
        total += _pss_bytes(pid)
        stack.extend(children.get(pid, []))
    return total


@dataclass
class Measured:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_mb: float
    driver_peak_mb: float = 0.0  # the command's own process alone (an engine's driver, without its workers)


def run_measured(args: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None) -> Measured:
    """Run ``args`` to completion; wall time and the peak tree PSS while it ran (and its own process's)."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    peak = driver_peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, driver_peak
        while not done.is_set():
            peak = max(peak, tree_pss(proc.pid))
            driver_peak = max(driver_peak, _pss_bytes(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return Measured(proc.returncode, out, err, wall, peak / 2**20, driver_peak / 2**20)
