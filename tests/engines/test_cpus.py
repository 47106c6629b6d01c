"""An embedded Ray is sized by the CPUs this process may use (affinity, cgroup v2 quota) or DATAHUB_RAY_NUM_CPUS,
not by ``os.cpu_count()``, which counts the host's CPUs (a 64-core CI runner, a container limited to 2 CPUs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from datahub.engines.cpus import cgroup_quota, usable_cpus
from datahub.errors import SpecError
from datahub.settings import RAY_NUM_CPUS_ENV, ray_num_cpus


@pytest.mark.parametrize(("text", "quota"), [("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1),
                                               ("max 100000", None), ("garbage", None)])
def test_cgroup_quota_is_read_in_whole_cpus_rounded_up(tmp_path, text, quota):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text(text + "\n")
    assert cgroup_quota(cpu_max) == quota
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(cpu_max=cpu_max) == (min(affinity, quota) if quota else affinity)
    assert cgroup_quota(tmp_path / "absent") is None


def test_usable_cpus_follow_the_affinity_mask_not_the_hosts_cpus():
    # a child pinned to one CPU (taskset's syscall) sees 1 usable CPU, whatever os.cpu_count() says
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from datahub.engines.cpus import usable_cpus; print(usable_cpus(), os.cpu_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "1"
    assert int(out[1]) == os.cpu_count()


def test_the_variable_sizes_an_embedded_ray_and_a_bad_value_names_the_fix():
    assert ray_num_cpus({}) is None
    assert ray_num_cpus({RAY_NUM_CPUS_ENV: "3"}) == 3
    for bad in ("0", "two", "-1"):
        with pytest.raises(SpecError, match=rf"{RAY_NUM_CPUS_ENV}='{bad}'.*whole number"):
            ray_num_cpus({RAY_NUM_CPUS_ENV: bad})


def test_an_embedded_ray_started_by_the_engine_gets_the_variables_cpus(tmp_path):
    code = """
import os, sys
from datahub.config.spec import EngineSpec
from datahub.engines.ray.engine import RayEngine
import ray
engine = RayEngine(EngineSpec(kind="ray"))
engine.start()
print(int(ray.cluster_resources()["CPU"]))
sys.stdout.flush()
ray.shutdown()
os._exit(0)
"""
    env = {**os.environ, RAY_NUM_CPUS_ENV: "3", "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "3"
