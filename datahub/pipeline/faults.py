"""Fault injection for crash-safety tests: ``checkpoint(name)`` kills the process there.

The runner calls ``checkpoint`` at its commit boundaries. When the environment variable
``DATAHUB_TEST_KILL_AT`` names that point (a comma-separated list is allowed), the process
sends itself SIGKILL: no cleanup, no ``finally``, exactly what an OOM-kill or node loss does.
This is the one place that variable is read; unset, a checkpoint costs a dict lookup.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "DATAHUB_TEST_KILL_AT"


def checkpoint(name: str) -> None:
    """Die by SIGKILL here when ``DATAHUB_TEST_KILL_AT`` names ``name``."""
    wanted = os.environ.get(KILL_AT_ENV)
    if wanted and name in wanted.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
