"""The post-lake commands put Arrow on the system allocator at start-up (datahub/allocator.py), with an opt-out."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# runs the CLI's entry (argv as a user types it), then reports the allocator pyarrow got in that process
PROBE = ("import os, sys; sys.argv = ['datahub', *sys.argv[1:]]; from datahub.cli import main; "
         "status = main._run(); import pyarrow as pa; "
         "print(status, pa.default_memory_pool().backend_name, os.environ.get('MALLOC_TRIM_THRESHOLD_'))")


def probe(*args: str, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("DATAHUB_ALLOCATOR", "ARROW_DEFAULT_MEMORY_POOL", "MALLOC_TRIM_THRESHOLD_",
                            "MALLOC_MMAP_THRESHOLD_")}
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env={**environ, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()[-1].split()


def test_post_lake_commands_use_the_system_allocator():
    assert probe("export", "--help") == ["0", "system", "131072"]
    assert probe("qa", "--help") == ["0", "system", "131072"]


def test_opt_out_and_other_commands_keep_arrows_allocator():
    status, backend, trim = probe("export", "--help", DATAHUB_ALLOCATOR="arrow")
    assert (status, trim) == ("0", "None") and backend != "system"
    status, backend, trim = probe("run", "--help")
    assert (status, trim) == ("0", "None") and backend != "system"


def test_a_user_set_arrow_pool_is_kept():
    assert probe("export", "--help", ARROW_DEFAULT_MEMORY_POOL="mimalloc")[:2] == ["0", "mimalloc"]


def test_an_unknown_setting_names_the_variable():
    out = subprocess.run([sys.executable, "-m", "datahub.cli.main", "qa", "--help"],
                         env={**os.environ, "DATAHUB_ALLOCATOR": "jemalloc"}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "DATAHUB_ALLOCATOR" in out.stderr and "system, arrow" in out.stderr


CHURN = """
import resource, sys
import numpy as np
from datahub.allocator import arrow_pool

def churn():  # page faults of allocating and freeing 3 MB arrays, as an export's batches do with their temporaries
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # (below 4 MiB: numpy asks no huge pages for them)
    for _ in range(40):
        array = np.ones(3 * 2**17)
        del array
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

outside = churn()
with arrow_pool():
    inside = churn()
print(outside, inside, churn())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_arrow_pool_lets_large_temporaries_reuse_heap_pages_then_restores_the_thresholds():
    """With the CLI's fixed 128 kB glibc thresholds every array above them is a fresh mapping (a page fault per page
    each time); inside ``arrow_pool`` they reuse the heap's pages, and after it the thresholds are back."""
    environ = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    out = subprocess.run([sys.executable, "-c", CHURN], env=environ, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    outside, inside, after = map(int, out.stdout.split())
    assert outside >= 40  # faults for every 3 MB array (768 pages; fewer where the kernel maps larger folios)
    assert inside < outside / 10
    assert after > outside / 2


def test_arrow_pool_puts_back_the_users_own_trim_threshold(monkeypatch):
    """A user's MALLOC_TRIM_THRESHOLD_ (applied by glibc at exec) is what the block restores, not the CLI's 128 kB."""
    import datahub.allocator as allocator

    calls: list[tuple[int, int]] = []

    class Function:  # a libc function: callable, and takes ctypes' argtypes
        def __init__(self, body):
            self.body = body

        def __call__(self, *args):
            return self.body(*args)

    class Libc:
        mallopt = Function(lambda parameter, value: calls.append((parameter, value)) or 1)
        malloc_trim = Function(lambda pad: 0)

    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda _name: Libc())
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(allocator.MALLOC_THRESHOLD))
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", str(64 << 20))
    with allocator._raised_malloc_thresholds():
        pass
    assert calls[-2:] == [(allocator._M_MMAP_THRESHOLD, allocator.MALLOC_THRESHOLD),
                          (allocator._M_TRIM_THRESHOLD, 64 << 20)]
