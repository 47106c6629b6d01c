"""Two runs of one job: the second is refused. Different writers on one table: no lost writes."""

from __future__ import annotations

import subprocess
import sys
import time

import pyarrow as pa

from datahub.config.spec import validate_job_spec
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.pipeline.corpus import REPO, job_raw, make_corpus, run_cli, write_job


def test_second_run_of_the_same_job_is_refused(tmp_path, ray_engine):
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=3)
    lake_root = tmp_path / "lake"
    job = write_job(tmp_path / "job.yaml", job_raw(corpus, lake_root))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from datahub.lake import Lake; from datahub.pipeline.lease import JobLease\n"
         "with JobLease(Lake(sys.argv[1]), 'crashjob', ttl_s=30):\n    print('held', flush=True); time.sleep(60)\n",
         str(lake_root)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = run_cli(["run", str(job)])
        assert refused.returncode == 2
        assert "job 'crashjob' is already running" in refused.stderr and f"pid {holder.pid}" in refused.stderr
        assert not Lake(lake_root).exists("samples")
    finally:
        holder.kill()
        holder.wait()
    # the holder died without releasing: the next run on this host takes the lease over
    assert run_job(validate_job_spec(job_raw(corpus, lake_root)), engine=ray_engine).status == "succeeded"


WRITER = """
import sys
import pyarrow as pa
from datahub.lake import Lake
lake, writer, n = Lake(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(n):
    lake.commit("shared", pa.table({"writer": [writer] * 3, "seq": [i] * 3}), txn=f"{writer}-{i}")
    lake.commit("shared", pa.table({"writer": [writer] * 3, "seq": [i] * 3}), txn=f"{writer}-{i}")  # replay: no-op
print("done")
"""


def test_concurrent_appends_from_processes_lose_nothing(tmp_path):
    lake_root = tmp_path / "lake"
    Lake(lake_root).commit("shared", pa.table({"writer": pa.array([], pa.string()), "seq": pa.array([], pa.int64())}), txn="create")
    start = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(lake_root), f"w{w}", "8"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO) for w in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1][-1500:] for r in results]
    table = Lake(lake_root).read("shared")
    pairs = sorted(zip(table.column("writer").to_pylist(), table.column("seq").to_pylist()))
    assert pairs == sorted((f"w{w}", i) for w in range(3) for i in range(8) for _ in range(3))
    assert Lake(lake_root).version("shared") >= 1 + 24  # one commit per txn (plus create / properties)
    assert time.time() - start < 120


def test_two_jobs_append_to_one_lake_concurrently(tmp_path, ray_engine):
    import ray

    address = ray.get_runtime_context().gcs_address
    lake_root = tmp_path / "lake"
    jobs = []
    for name in ("job-one", "job-two"):
        corpus = make_corpus(tmp_path / name, files=2, per_file=6)
        jobs.append(write_job(tmp_path / f"{name}.yaml", job_raw(corpus, lake_root, name=name)))
    env = {"PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "datahub.cli.main", "run", str(j), "--json", "--set", f"engine.address={address}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env={**__import__("os").environ, **env})
             for j in jobs]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    lake = Lake(lake_root)
    run_ids = lake.read("samples").column("ingest_run_id").to_pylist()
    assert sum(r.startswith("job-one-") for r in run_ids) == 13 and sum(r.startswith("job-two-") for r in run_ids) == 13
    runs = lake.read("runs")
    assert sorted(runs.column("job_name").to_pylist()) == ["job-one", "job-two"]
    assert set(runs.column("status").to_pylist()) == {"succeeded"}
