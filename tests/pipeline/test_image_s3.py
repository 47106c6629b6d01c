"""Image-text inputs on the real Ceph S3 endpoint: JSONL with relative paths and s3:// URIs, a WebDataset shard."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest

from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.ceph import ceph_s3  # noqa: F401  (session fixture)
from tests.operators.media.conftest import IMAGES, image_of, shard_members

pytestmark = pytest.mark.ceph


def test_image_references_and_shards_on_s3(job_spec, ceph_s3, tmp_path):  # noqa: F811
    bucket = ceph_s3.new_bucket("images")
    fs = ceph_s3.filesystem()
    members = shard_members()
    pictures = {k: image_of(m) for k, m in sorted(members.items()) if k.startswith("img")}
    keys = list(pictures)[:3]
    fs.pipe(f"{bucket}/refs/pics/{keys[0]}.bin", pictures[keys[0]])  # relative to the JSONL file's folder
    fs.pipe(f"{bucket}/pics/{keys[1]}.bin", pictures[keys[1]])
    lines = [{"caption": f"relative {keys[0]}", "image_path": f"pics/{keys[0]}.bin"},
             {"caption": f"absolute {keys[1]}", "image_uri": f"s3://{bucket}/pics/{keys[1]}.bin"},
             {"caption": "gone", "image_path": "pics/nothing-here.bin"}]
    fs.pipe(f"{bucket}/refs/refs.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode())
    fs.put(str(IMAGES / "demo-00000.tar"), f"{bucket}/shards/demo-00000.tar")
    options = ceph_s3.storage_options()
    spec = job_spec(
        inputs=[{"uri": f"s3://{bucket}/refs/*.jsonl", "kind": "image_text", "text_field": "caption",
                 "storage_options": options},
                {"uri": f"s3://{bucket}/shards/*.tar", "format": "webdataset", "kind": "image_text",
                 "storage_options": options}],
        limits={"max_record_bytes": 20_000_000},
    )
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    lake = Lake(spec.lake.root)
    samples = lake.read("samples")
    from_refs = samples.filter(pc.match_substring(samples.column("source_uri"), "refs.jsonl"))
    by_caption = dict(zip(from_refs.column("text").to_pylist(), from_refs.column("image").to_pylist()))
    assert by_caption == {f"relative {keys[0]}": pictures[keys[0]], f"absolute {keys[1]}": pictures[keys[1]]}
    uris = set(from_refs.column("image_uri").to_pylist())
    assert uris == {f"s3://{bucket}/refs/pics/{keys[0]}.bin", f"s3://{bucket}/pics/{keys[1]}.bin"}
    quarantine = lake.read("quarantine")
    reasons = sorted(quarantine.column("reason").to_pylist())
    assert reasons == sorted(["image_not_found", "undecodable_image", "unknown_image_format", "empty_image",
                              "decompression_bomb"])
    counts = result.counts
    assert counts["records_read"] == len(lines) + len(members)
    assert counts["samples_written"] == len(lines) - 1 + len(members) - 4
