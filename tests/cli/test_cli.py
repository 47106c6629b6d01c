"""The CLI as a user runs it: a real subprocess, real exit codes and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def datahub(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_help_is_fast_and_imports_no_heavy_library():
    code = ("import sys; from datahub.cli.main import app; import typer.testing as t; "
            "r = t.CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output; "
            "heavy = sorted(m for m in ('ray', 'pyspark', 'great_expectations', 'torch', 'deltalake') if m in sys.modules); "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_run_then_inspect_json(tmp_path):
    lake = tmp_path / "lake"
    run = datahub("run", "jobs/demo.yaml", "--lake", str(lake), "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    for noise in ("Progress bars disabled", "does not have any available CPUs"):  # Ray Data's, not ours
        assert noise not in run.stderr, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["status"] == "succeeded"
    c = result["counts"]
    assert c["records_read"] == c["samples_written"] + c["dropped_total"] + c["quarantined_total"]
    assert c["quarantined_total"] >= 5  # the demo corpus ships broken records on purpose
    inspect = datahub("inspect", str(lake), "--json")
    assert inspect.returncode == 0, inspect.stderr
    tables = json.loads(inspect.stdout)["tables"]
    assert tables["samples"]["rows"] == c["samples_written"]
    assert tables["quarantine"]["rows"] == c["quarantined_total"]
    again = datahub("run", "jobs/demo.yaml", "--lake", str(lake))
    assert again.returncode == 0 and "nothing to do" in again.stdout
    detail = datahub("inspect", str(lake), "samples")
    assert "sample_id: string" in detail.stdout and "txn=demo-" in detail.stdout


def test_spec_error_exit_code_and_message(tmp_path):
    out = datahub("run", "jobs/demo.yaml", "--set", "graph.normalize.params.max_blank_lines=99", "--check")
    assert out.returncode == 2
    assert "jobs/demo.yaml: graph.normalize.params.max_blank_lines" in out.stderr
    ok = datahub("run", "jobs/demo.yaml", "--check", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["valid"] is True
