"""The embedded Ray engine honours the spec's resources (in a fresh process: the session's Ray is shared)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.pipeline.corpus import REPO

SCRIPT = """
import ray
from datahub.config.spec import EngineSpec
from datahub.engines.ray import RayEngine

engine = RayEngine(EngineSpec(num_cpus=1, object_store_mb=128))
engine.start()
resources = ray.cluster_resources()
print(int(resources["CPU"]), int(resources["object_store_memory"]))
engine.stop()
"""


def test_embedded_ray_gets_the_cpus_and_object_store_cap_of_the_spec(tmp_path):
    script = tmp_path / "start_ray.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    cpus, store = map(int, done.stdout.split()[-2:])
    assert cpus == 1 and store == 128 * 2**20
