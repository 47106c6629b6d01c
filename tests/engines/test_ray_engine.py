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

@ray.remote
def environment():
    import os
    return [os.environ.get(name) for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")]

print(*ray.get(environment.remote()))
resources = ray.cluster_resources()
print(int(resources["CPU"]), int(resources["object_store_memory"]))
engine.stop()
"""


def _run_script(tmp_path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    """``text`` run as a fresh Python process (its own embedded Ray) with the repository importable; must exit 0."""
    script = tmp_path / name
    script.write_text(text)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_embedded_ray_gets_the_cpus_and_object_store_cap_of_the_spec(tmp_path):
    """...and its workers get the malloc settings that return freed memory to the system."""
    done = _run_script(tmp_path, "start_ray.py", SCRIPT)
    *_, mmap_threshold, trim_threshold, cpus, store = done.stdout.split()
    assert int(cpus) == 1 and int(store) == 128 * 2**20
    assert (mmap_threshold, trim_threshold) == ("131072", "131072")


DATA_SCRIPT = """
import sys

import pyarrow as pa

from datahub.config.spec import EngineSpec
from datahub.engines.ray import RayEngine

engine = RayEngine(EngineSpec(num_cpus=1, object_store_mb=128))
engine.start()
imported_at_start = "ray.data" in sys.modules
frame = engine.from_arrow(pa.table({"x": [1, 2, 3]}))
import ray.data

context = ray.data.DataContext.get_current()
print(imported_at_start, frame.count(), context.enable_progress_bars, context.print_on_execution_start)
engine.stop()
"""


def test_ray_data_is_set_up_by_the_first_frame_not_at_start(tmp_path):
    """Commands of plain Ray tasks (an export) do not pay Ray Data's import; frames still get datahub's settings."""
    done = _run_script(tmp_path, "data_settings.py", DATA_SCRIPT)
    assert done.stdout.split()[-4:] == ["False", "3", "False", "False"]
