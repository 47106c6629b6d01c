"""A job reading s3:// inputs into an s3:// lake on the real Ceph RGW started by .ci/ceph.sh."""

from __future__ import annotations

import gzip
import json

import pytest

from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.ceph import ceph_s3  # noqa: F401  (session fixture)

pytestmark = pytest.mark.ceph


def test_s3_inputs_into_s3_lake(job_spec, ceph_s3, ray_engine):  # noqa: F811
    bucket = ceph_s3.new_bucket("ingest")
    fs = ceph_s3.filesystem()
    lines = [json.dumps({"text": f"Stored on Ceph, document {i}."}) for i in range(25)] + ["{not json"]
    fs.pipe(f"{bucket}/raw/part-0.jsonl.gz", gzip.compress("\n".join(lines).encode(), mtime=0))
    fs.pipe(f"{bucket}/raw/part-1.jsonl", (json.dumps({"text": "One more document."}) + "\n").encode())
    options = ceph_s3.storage_options()
    spec = job_spec(
        inputs=[{"uri": f"s3://{bucket}/raw/*.jsonl*", "storage_options": options}],
        graph={"normalize": {"op": "normalize_text"}, "samples": {"sink": "samples", "after": ["normalize"]}},
        lake={"root": f"s3://{bucket}/lake", "storage_options": options},
    )
    result = run_job(spec, engine=ray_engine)
    assert result.status == "succeeded", result
    assert result.counts["samples_written"] == 26 and result.counts["quarantined"] == {"invalid_json": 1}
    lake = Lake(f"s3://{bucket}/lake", storage_options=options)
    assert sorted(lake.tables()) == ["lineage", "quarantine", "runs", "samples"]
    samples = lake.read("samples")
    assert samples.num_rows == 26
    assert {u.split("/")[-1] for u in samples.column("source_uri").to_pylist()} == {"part-0.jsonl.gz", "part-1.jsonl"}
    assert all(u.startswith(f"s3://{bucket}/raw/") for u in samples.column("source_uri").to_pylist())
    assert run_job(spec, engine=ray_engine).status == "skipped"  # input identity (size + etag) recorded in runs
    runs = lake.read("runs").to_pylist()
    assert all(i["etag"] for i in runs[0]["inputs"])
