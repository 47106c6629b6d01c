"""The post-lake commands put Arrow on the system allocator at start-up (datahub/allocator.py), with an opt-out."""

from __future__ import annotations

import os
import subprocess
import sys

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
