"""The CPUs this process may use: its CPU affinity, capped by a cgroup CPU quota (a container's ``--cpus``).

``os.cpu_count()`` counts the host's CPUs, so an embedded engine sized by it on a 64-core CI runner or in a
container limited to 2 CPUs starts 64 workers that share 2 CPUs (Python 3.13's ``os.process_cpu_count`` sees the
affinity, not the quota). The quota is the smallest one on the process's cgroup path and the cgroups above it, in
cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` of the ``cpu`` controller), as listed
in ``/proc/self/cgroup``; where that path is not mounted (a container sees its own cgroup as the mount's root), the
mount's root is read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(*, cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """CPUs this process may run on: the affinity mask's size, at most the cgroup quota rounded up; >= 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_quota(cgroup_root=cgroup_root, proc_cgroup=proc_cgroup)
    return max(1, min(cpus, quota) if quota is not None else cpus)


def cgroup_quota(*, cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The smallest CPU quota on this process's cgroup path (v2 or v1), in whole CPUs rounded up; None: no quota."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: one unified hierarchy
            for mount in (cgroup_root, cgroup_root / "unified"):
                quotas += _along(mount, path, _v2_quota)
        elif "cpu" in controllers.split(","):
            for mount in {cgroup_root / controllers, cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"}:
                quotas += _along(mount, path, _v1_quota)
    return max(1, math.ceil(min(quotas))) if quotas else None


def _along(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """Quotas of the cgroup at ``path`` under ``mount`` and of each cgroup above it (the mount's root included)."""
    if not mount.is_dir():
        return []
    found = []
    folder = mount / path.strip("/")
    while True:
        quota = read(folder)
        if quota is not None:
            found.append(quota)
        if folder == mount or mount not in folder.parents:
            break
        folder = folder.parent
    return found


def _v2_quota(folder: Path) -> float | None:
    fields = _read(folder / "cpu.max").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1_quota(folder: Path) -> float | None:
    return _ratio(_read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us"))


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None  # v1 says -1 for no quota


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
