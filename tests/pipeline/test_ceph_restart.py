"""A run on an s3:// lake survives radosgw going away and coming back (retries with backoff)."""

from __future__ import annotations

import threading
import time

from datahub.config.spec import validate_job_spec
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.ceph import ceph_s3, start_rgw, stop_rgw  # noqa: F401
from tests.pipeline.corpus import job_raw, make_corpus


def test_run_completes_across_an_rgw_restart(ceph_s3, tmp_path, ray_engine):  # noqa: F811
    corpus = make_corpus(tmp_path / "corpus", files=3, per_file=20)
    options = ceph_s3.storage_options()
    lake_root = f"s3://{ceph_s3.new_bucket('restart')}/lake"
    spec = validate_job_spec(job_raw(corpus, lake_root, storage_options=options))
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = run_job(spec, engine=ray_engine)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.5)
    stop_rgw()
    try:
        time.sleep(4)  # the run hits the outage: commits and lease renewals see connection refused
    finally:
        start_rgw()
    worker.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].status == "succeeded"
    lake = Lake(lake_root, storage_options=options)
    ids = lake.read("samples").column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 61
    assert lake.read("runs").column("status").to_pylist() == ["succeeded"]
