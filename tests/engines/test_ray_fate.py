"""The embedded Ray dies with its driver: after a kill -9 of the driver no process of that Ray
outlives it for long (its agents and idle workers used to live on for one to two minutes), and the
embedded engine sets Ray's auth mode itself (no token-authentication warning)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from datahub.engines.ray import watchdog

DRIVER = """
import os, sys, time
import ray
from datahub.config.spec import EngineSpec
from datahub.engines.ray import RayEngine

engine = RayEngine(EngineSpec(kind="ray", num_cpus=2))
engine.start()

@ray.remote
def pid():
    time.sleep(0.5)
    return os.getpid()

print("WORKERS", *sorted(set(ray.get([pid.remote() for _ in range(4)]))), flush=True)
time.sleep(600)
"""
BOUND_SECONDS = 30  # the watchdog polls every 0.2 s; without it Ray's agents lived 60-120 s


def session_members(session: int) -> dict[int, str]:
    """Live processes of a session (Ray's processes stay in the driver's session): pid -> command line."""
    members = {}
    for pid in watchdog.processes():
        try:
            with open(f"/proc/{pid}/stat") as handle:
                sid = int(handle.read().rsplit(")", 1)[1].split()[3])
            if sid == session:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    members[pid] = handle.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except (OSError, IndexError, ValueError):
            continue
    return members


@pytest.mark.skipif(not watchdog.supported(), reason="reads /proc (Linux)")
def test_embedded_ray_processes_die_with_a_killed_driver(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # as a user's shell: unset
    stderr = open(tmp_path / "driver.err", "w")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                              start_new_session=True)  # its own session: every Ray process it starts is found by sid
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line.startswith("WORKERS"), (tmp_path / "driver.err").read_text()[-3000:]
        workers = {int(pid) for pid in line.split()[1:]}
        before = session_members(driver.pid)
        assert workers <= set(before) and any("raylet" in cmd for cmd in before.values())
        assert "Token authentication" not in (tmp_path / "driver.err").read_text()

        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + BOUND_SECONDS
        left = session_members(driver.pid)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = session_members(driver.pid)
        assert not left, f"Ray processes outlived the killed driver: {left}"
    finally:
        for pid in session_members(driver.pid):  # only processes of the session this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        stderr.close()
