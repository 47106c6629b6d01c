"""Shared fixtures: one Ray (and one Spark) per test session, small spec factories."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # loopback-only test cluster
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# CLI subprocesses that start an embedded Ray (a job with no engine.num_cpus) size it like the session's Ray,
# not by the CI runner's cores (64 workers sharing the runner would time out the CLI tests)
os.environ.setdefault("DATAHUB_RAY_NUM_CPUS", "2")


@pytest.fixture(scope="session")
def ray_engine():
    """A RayEngine on one embedded local Ray shared by the whole session."""
    import ray

    from datahub.config.spec import EngineSpec
    from datahub.engines.ray import RayEngine

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    engine = RayEngine(EngineSpec(kind="ray"))
    engine.start()  # no-op on an initialized Ray; the engine will not shut it down
    yield engine
    ray.shutdown()


@pytest.fixture
def job_spec(tmp_path):
    """Factory: a validated JobSpec over the given inputs, lake under tmp_path."""
    from datahub.config.spec import validate_job_spec

    def make(inputs: list[dict[str, Any]] | None = None, graph: dict[str, Any] | None = None, **extra: Any):
        raw: dict[str, Any] = {
            "name": extra.pop("name", "test"),
            "lake": {"root": str(extra.pop("lake_root", tmp_path / "lake"))},
            "inputs": inputs or [{"uri": str(REPO / "data/demo/*.jsonl.*")}],
            "graph": graph or {"samples": {"sink": "samples"}},
        }
        raw.update(extra)
        return validate_job_spec(raw, source="test.yaml")

    return make


@pytest.fixture(scope="session")
def image_demo_export(tmp_path_factory):
    """The image demo job (jobs/image-demo.yaml) run in-process (ArrowEngine) and its samples exported to a cfs tier
    once per session: (lake, manifest, storage, cfs root). Read-only for the tests that share it."""
    from datahub.config.spec import load_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.export import export_table_version
    from datahub.lake import Lake
    from datahub.pipeline.run import run_job
    from datahub.storage import validate_storage_config

    root = tmp_path_factory.mktemp("image-demo-export")
    here = os.getcwd()
    os.chdir(REPO)  # the job's input paths are relative to the repository
    try:
        spec = load_job_spec(REPO / "jobs/image-demo.yaml", [f"lake.root={root / 'lake'}"])
        result = run_job(spec, engine=ArrowEngine())
        assert result.status == "succeeded", result.error
    finally:
        os.chdir(here)
    lake = Lake(root / "lake")
    storage = validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": str(root / "cfs")}}}, source="t.yaml")
    manifest = export_table_version(lake, table="samples", version=lake.version("samples"), release_name="img-v1",
                                    tier="cfs", storage=storage, shard_samples=8)
    return lake, manifest, storage, root / "cfs"
