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


def _cgroups(tmp_path, proc: str, files: dict[str, str]):
    root = tmp_path / "sys-fs-cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    root.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cgroup").write_text(proc)
    return {"cgroup_root": root, "proc_cgroup": tmp_path / "cgroup"}


@pytest.mark.parametrize(("text", "quota"), [("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1),
                                               ("max 100000", None), ("garbage", None)])
def test_a_cgroup_v2_quota_is_read_in_whole_cpus_rounded_up(tmp_path, text, quota):
    where = _cgroups(tmp_path, "0::/\n", {"cpu.max": text})
    assert cgroup_quota(**where) == quota
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(**where) == (min(affinity, quota) if quota else affinity)


def test_the_smallest_quota_on_the_cgroup_path_counts_in_v2_and_v1(tmp_path):
    # v2, nested: the job's cgroup has none, its parent 1.5 CPUs, the root none
    v2 = _cgroups(tmp_path / "v2", "0::/kubepods/pod1/job\n",
                  {"cpu.max": "max 100000", "kubepods/pod1/cpu.max": "150000 100000", "kubepods/pod1/job/cpu.max":
                   "max 100000"})
    assert cgroup_quota(**v2) == 2
    # v1 (this machine's layout): the cpu controller's cfs quota, -1 meaning none
    v1 = _cgroups(tmp_path / "v1", "4:memory:/x\n1:cpu,cpuacct:/docker/abc\n0::/\n",
                  {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000",
                   "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000",
                   "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"})
    assert cgroup_quota(**v1) == 3
    # a container sees its own cgroup as the mount's root: the host path in /proc/self/cgroup is not mounted
    inside = _cgroups(tmp_path / "inside", "1:cpu:/docker/abc\n", {"cpu/cpu.cfs_quota_us": "100000",
                                                                    "cpu/cpu.cfs_period_us": "100000"})
    assert cgroup_quota(**inside) == 1
    assert cgroup_quota(**_cgroups(tmp_path / "none", "1:cpu:/\n0::/\n", {})) is None
    assert cgroup_quota(cgroup_root=tmp_path / "absent", proc_cgroup=tmp_path / "absent") is None


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
