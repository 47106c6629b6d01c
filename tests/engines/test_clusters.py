"""Outgrowing one machine: the demo job on a real Spark standalone cluster and a real multi-process Ray cluster.

Both clusters run on 127.0.0.1 from the installed packages' own launchers, and the job runs
through the CLI in a subprocess (this test process already holds an embedded Ray and Spark).
Only the processes started here are stopped, by process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from datahub.config.spec import load_job_spec
from datahub.lake.lake import Lake
from datahub.pipeline.run import run_job
from datahub.qa import run_for_job
from tests.engines.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@contextmanager
def _process(args: list[str], *, env: dict[str, str], log: Path):
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _wait(check, what: str, log: Path, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}; log:\n{log.read_text()[-3000:]}")
        try:
            if check():
                return
        except (OSError, ValueError):  # not up: refused, or (loaded machine) the UI's HTML before its JSON answers
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what} did not come up in {timeout_s:.0f}s; log:\n{log.read_text()[-3000:]}")


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _master_state(webui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=5) as response:
        return json.load(response)


def _datahub_run(lake: Path, overrides: list[str], env: dict[str, str]) -> dict:
    args = [str(BIN / "datahub"), "run", "jobs/demo.yaml", "--lake", str(lake), "--json"]
    for item in overrides:
        args += ["--set", item]
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return json.loads(result.stdout[result.stdout.index("{"):])


@pytest.fixture(scope="module")
def local_demo(tmp_path_factory, spark_engine):
    """The demo job on the embedded Spark: what every cluster run must reproduce."""
    lake = tmp_path_factory.mktemp("local") / "lake"
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        result = run_job(load_job_spec(REPO / "jobs/demo.yaml", [f"lake.root={lake}", "engine.kind=spark"]), engine=spark_engine,
                         qa_gate=run_for_job)
    finally:
        os.chdir(cwd)
    assert result.status == "succeeded"
    return Lake(lake)


def _same_outcome(lake: Lake, reference: Lake) -> None:
    for table in ("samples", "lineage", "quarantine"):
        ours, theirs = lake.read(table), reference.read(table)
        keep = sorted(c for c in theirs.column_names if c != "ts")
        rows = lambda t: sorted(json.dumps(r, sort_keys=True, default=str) for r in t.select(keep).to_pylist())  # noqa: E731
        assert rows(ours) == rows(theirs), table


def test_demo_job_on_a_spark_standalone_cluster(tmp_path, local_demo):
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path),
           "SPARK_WORKER_DIR": str(tmp_path / "work"), "PYSPARK_PYTHON": sys.executable}
    spark_class = str(spark_home / "bin" / "spark-class")
    port, webui, worker_ui = free_port(), free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    with _process([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                   "--webui-port", str(webui)], env=env, log=tmp_path / "master.log") as master_proc:
        _wait(lambda: _port_open(port) and _port_open(webui), "spark master", tmp_path / "master.log", master_proc)
        with _process([spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1", "--cores", "2",
                       "--memory", "2g", "--webui-port", str(worker_ui), "--work-dir", str(tmp_path / "work")],
                      env=env, log=tmp_path / "worker.log") as worker_proc:
            _wait(lambda: _master_state(webui)["aliveworkers"] >= 1, "spark worker", tmp_path / "worker.log", worker_proc)
            result = _datahub_run(tmp_path / "lake", ["engine.kind=spark", f"engine.master={master}",
                                                      "engine.conf={spark.executor.memory: 1g, spark.cores.max: '2'}"], env)
            state = _master_state(webui)
    assert result["status"] == "succeeded"
    # the job ran as an application of this master, on its worker's executors
    assert [app["name"] for app in state["completedapps"] + state["activeapps"]] == ["datahub"]
    lake = Lake(tmp_path / "lake")
    assert lake.read("runs").column("engine").to_pylist() == ["spark"]
    _same_outcome(lake, local_demo)


def test_demo_job_on_a_multi_process_ray_cluster(tmp_path, local_demo):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    temp_dir = tempfile.mkdtemp(prefix="dhray", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    port = free_port()
    common = ["--num-cpus", "1", "--block", "--temp-dir", temp_dir, "--node-ip-address", "127.0.0.1",
              "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())]
    ray = str(BIN / "ray")
    head = [ray, "start", "--head", "--port", str(port), "--include-dashboard=false", *common]
    try:
        with _process(head, env=env, log=tmp_path / "head.log") as head_proc:
            _wait(lambda: _port_open(port), "ray head", tmp_path / "head.log", head_proc)
            with _process([ray, "start", "--address", f"127.0.0.1:{port}", *common], env=env, log=tmp_path / "node.log") as node_proc:
                _wait(lambda: _ray_nodes(port, env) >= 2, "second ray node", tmp_path / "node.log", node_proc)
                result = _datahub_run(tmp_path / "lake", ["engine.kind=ray", f"engine.address=127.0.0.1:{port}"], env)
    finally:
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)
    assert result["status"] == "succeeded"
    lake = Lake(tmp_path / "lake")
    assert lake.read("runs").column("engine").to_pylist() == ["ray"]
    _same_outcome(lake, local_demo)


def _ray_nodes(port: int, env: dict[str, str]) -> int:
    probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False); "
             "print(sum(1 for n in ray.nodes() if n['Alive']))")
    out = subprocess.run([sys.executable, "-c", probe, f"127.0.0.1:{port}"], env=env, capture_output=True, text=True, timeout=60)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0
