"""The CPUs this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a container's ``--cpus``).

``os.cpu_count()`` counts the host's CPUs, so an embedded engine sized by it on a 64-core CI runner or in a
container limited to 2 CPUs starts 64 workers that share 2 CPUs (Python 3.13's ``os.process_cpu_count`` sees the
affinity, not the quota).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus(*, cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may run on: the affinity mask's size, at most the cgroup v2 quota rounded up; >= 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_quota(cpu_max)
    return max(1, min(cpus, quota) if quota is not None else cpus)


def cgroup_quota(cpu_max: Path = CGROUP_CPU_MAX) -> int | None:
    """The cgroup v2 CPU quota in whole CPUs, rounded up (``cpu.max``: ``QUOTA PERIOD`` or ``max PERIOD``)."""
    try:
        fields = cpu_max.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None
