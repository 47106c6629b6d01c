"""``datahub.pipeline.faults``: the fault points crash-safety tests kill a run at."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from datahub.pipeline.faults import KILL_AT_ENV
from tests.pipeline.corpus import REPO

_CHECKPOINT = ("from datahub.pipeline.faults import checkpoint\n"
               "try:\n    checkpoint('after_graph')\nexcept KeyboardInterrupt:\n    print('interrupted')\n"
               "else:\n    print('went on')\n")


def test_a_sigint_fault_interrupts_a_process_started_with_sigint_ignored():
    """`name@SIGINT` is Ctrl-C even where the process started with SIGINT ignored (pytest run under nohup or with
    `&` by a script, as CI runners may): the self-sent SIGINT was a no-op there, and three SIGINT tests failed."""
    done = subprocess.run([sys.executable, "-c", _CHECKPOINT], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, KILL_AT_ENV: "after_graph@SIGINT", "PYTHONPATH": str(REPO)},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.stdout.strip() == "interrupted", (done.stdout, done.stderr[-2000:])
