"""What the CLI tests share: the CLI as a subprocess, and one small lake (three documents, samples v1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def datahub(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """The CLI as cron runs it: a real subprocess, stdout and stderr piped."""
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def make_small_lake(root: Path) -> Path:
    """ROOT/a.jsonl (three documents) run into ROOT/lake by the in-process Arrow engine: samples v1. Returns the lake."""
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.run import run_job

    (root / "a.jsonl").write_text("".join(json.dumps({"text": f"document {i} about rivers and the valley towns"}) + "\n"
                                          for i in range(3)))
    spec = validate_job_spec({"name": "small", "lake": {"root": str(root / "lake")},
                              "inputs": [{"uri": str(root / "a.jsonl")}], "graph": {"samples": {"sink": "samples"}}})
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    return root / "lake"


@pytest.fixture(scope="module")
def small_lake(tmp_path_factory) -> Path:
    """A lake of its own per test module (some modules add releases or events to it): see make_small_lake."""
    return make_small_lake(tmp_path_factory.mktemp("small-lake"))
