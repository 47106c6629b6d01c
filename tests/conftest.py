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
