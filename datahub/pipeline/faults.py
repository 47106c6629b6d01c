"""Fault injection for crash-safety tests: ``checkpoint(name)`` kills the process there.

The runner calls ``checkpoint`` at its commit boundaries (``after_commit:TABLE``, ...), the
dedup operators inside their engine hooks (``minhash_dedup:after_signatures``,
``minhash_dedup:after_clustering``, ``exact_dedup:after_keepers``) and the export after each
published shard and before the manifest (``export:after_shard:N``, ``export:before_manifest``,
``export:after_tier_manifest``), and the tier copy after each verified shard (``tier:after_shard:N``). When the environment variable
``DATAHUB_TEST_KILL_AT`` names that point (a comma-separated list is allowed; ``name#N`` means
the N-th time this process reaches it, e.g. the second run of one ``run_job`` call), the process
sends itself SIGKILL: no cleanup, no ``finally``, exactly what an OOM-kill or node loss does.
``name@SIGINT`` sends that signal instead (Ctrl-C: a KeyboardInterrupt that unwinds the stack), first restoring
Python's Ctrl-C handler where SIGINT is ignored (a process started under nohup or with ``&`` by a script, as CI
runners may start pytest): the verdict must not depend on how the tests were started.
The variable is read through ``datahub.settings.kill_at``; unset, a checkpoint costs a dict lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

from datahub.settings import KILL_AT_ENV, kill_at

__all__ = ["KILL_AT_ENV", "checkpoint"]


_reached: Counter[str] = Counter()  # checkpoint name -> times reached in this process (only when armed)


def checkpoint(name: str) -> None:
    """Die by SIGKILL here when ``DATAHUB_TEST_KILL_AT`` names ``name`` (or ``name#N``, N-th time)."""
    wanted = kill_at()
    if not wanted:
        return
    _reached[name] += 1
    for item in wanted.split(","):
        point, _, signal_name = item.strip().partition("@")
        point, _, nth = point.partition("#")
        if point == name and (not nth or int(nth) == _reached[name]):
            sent = getattr(signal, signal_name or "SIGKILL")
            if sent == signal.SIGINT and signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
                if threading.current_thread() is not threading.main_thread():
                    raise KeyboardInterrupt  # signal.signal works in the main thread only
                signal.signal(signal.SIGINT, signal.default_int_handler)  # SIGINT ignored since start: as Ctrl-C
            os.kill(os.getpid(), sent)
