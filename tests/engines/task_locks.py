"""Tasks that tell a test whether they still run: each holds an exclusive lock on ``lock-N`` in a folder while it
runs, and leaves ``finished-N`` if it ever ends on its own (a task its pass cancelled never does)."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

HOLD_S = 60.0  # how long a healthy task runs: far longer than a pass that cancels it takes to return
# How long the failing task waits for another task to start (it raises as soon as one does): only a guard against an
# engine that runs one task at a time. A pass right after a failed one waits for Ray to start fresh workers (the
# failed pass's were killed): measured 0-18.9 s at load ~10 on 2 cores, and a 20 s wait expired once there ("no task
# ran beside the failing one"); a loaded CI machine may take longer still.
START_WAIT_S = 120.0


def fail_once_running(folder: str, task: int, *, failing: int = 0, wait_s: float = START_WAIT_S) -> None:
    """Task ``failing`` raises ``ValueError("task N fails")`` once another task runs (or after ``wait_s``); every
    other task holds ``lock-N`` for ``HOLD_S`` and then leaves ``finished-N``."""
    if task == failing:
        deadline = time.monotonic() + wait_s
        while not any(Path(folder).glob("running-*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        raise ValueError(f"task {task} fails")
    with open(f"{folder}/lock-{task}", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        Path(f"{folder}/running-{task}").touch()
        time.sleep(HOLD_S)
    Path(f"{folder}/finished-{task}").touch()


def still_running(folder: Path) -> list[str]:
    """The ``lock-N`` files a task still holds."""
    running = []
    for lock in sorted(folder.glob("lock-*")):
        with open(lock) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                running.append(lock.name)
    return running


def assert_stopped(folder: Path) -> None:
    """Some task of the pass ran beside the failing one, and none runs now or ran to its end."""
    assert list(folder.glob("running-*")), f"no task ran beside the failing one in {folder}"
    assert still_running(folder) == []
    assert sorted(p.name for p in folder.glob("finished-*")) == []
