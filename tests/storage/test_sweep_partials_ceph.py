"""Tier.sweep_partials on the real Ceph RGW: a process SIGKILLed in the middle of ``publish_stream``'s multipart
upload leaves its parts stored (no listing shows them); the sweep of that directory aborts the upload, and only
the uploads of keys directly in that directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from datahub.storage import validate_storage_config
from datahub.storage.tier import STALE_PARTIAL_S, Tier
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401

pytestmark = pytest.mark.ceph

REPO = Path(__file__).resolve().parents[2]

# A writer that streams two parts' worth of bytes into the tier (each 8 MiB write stores a part), then hangs
# before the upload completes.
_WRITER = """
import json, sys, time
from datahub.storage import validate_storage_config
tier = validate_storage_config(json.loads(sys.argv[1])).tier("t")
def chunks():
    yield b"x" * (8 * 2**20)
    yield b"x" * (8 * 2**20)
    time.sleep(600)
tier.publish_stream(sys.argv[2], chunks(), size=3 * 8 * 2**20, sha256="0" * 64)
"""


def _uploads(fs: Any, bucket: str) -> dict[str, str]:
    fs.invalidate_cache()
    return {u["Key"]: u["UploadId"] for u in fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])}


def _parts(fs: Any, bucket: str, key: str, upload_id: str) -> list[int]:
    return [p["PartNumber"] for p in fs.call_s3("list_parts", Bucket=bucket, Key=key, UploadId=upload_id)
            .get("Parts", [])]


def _start_upload(fs: Any, bucket: str, key: str) -> str:
    """An incomplete multipart upload of ``key`` with one stored part."""
    upload_id = str(fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"])
    fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"y" * (5 * 2**20))
    return upload_id


def test_sweep_aborts_the_upload_of_a_killed_writer_in_that_directory_only(
        ceph_s3: S3Endpoint, tmp_path: Path) -> None:  # noqa: F811
    bucket = ceph_s3.new_bucket("sweep")
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    config = {"tiers": {"t": {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket,
                              "prefix": "releases", "s3_region": ceph_s3.region,
                              "credentials": {"file": str(credentials)}}}}
    tier: Tier = validate_storage_config(config).tier("t")
    fs = ceph_s3.filesystem()
    uri = tier.uri("r1", "shard-000000.tar")
    killed_key = "releases/r1/shard-000000.tar"

    writer = subprocess.Popen([sys.executable, "-c", _WRITER, json.dumps(config), uri], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (killed_key in _uploads(fs, bucket) and _parts(fs, bucket, killed_key,
                                                                  _uploads(fs, bucket)[killed_key])):
            assert writer.poll() is None, writer.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the writer never stored a part"
            time.sleep(0.2)
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    killed_id = _uploads(fs, bucket)[killed_key]
    assert _parts(fs, bucket, killed_key, killed_id)  # the killed writer's parts stay stored
    assert tier.size(uri) is None  # and nothing was published

    untouched = {key: _start_upload(fs, bucket, key) for key in (
        "releases/r2/shard-000000.tar",  # another release
        "releases/r1x/shard-000000.tar",  # a directory whose name starts with r1
        "releases/r1/tokens/part-000000.bin",  # a subdirectory (a token export's folder)
        "other/r1/shard-000000.tar",  # outside the tier's prefix
    )}
    also_in_r1 = _start_upload(fs, bucket, "releases/r1/shard-000001.tar")

    assert tier.sweep_partials(tier.uri("r1")) == 2
    left = _uploads(fs, bucket)
    assert left == untouched  # both uploads in r1 aborted (ids differ from also_in_r1 and killed_id), others kept
    assert also_in_r1 not in left.values() and killed_id not in left.values()
    assert tier.sweep_partials(tier.uri("r1")) == 0  # idempotent
    assert tier.sweep_partials(tier.uri("no-such-release")) == 0
    for key, upload_id in untouched.items():  # their parts are still there
        assert _parts(fs, bucket, key, upload_id) == [1]


def test_sweep_with_older_than_keeps_the_uploads_still_being_written(
        ceph_s3: S3Endpoint, tmp_path: Path) -> None:  # noqa: F811
    """tier apply sweeps with ``older_than`` (an overlapping apply or export may be uploading into the release): an
    upload counts as live while its newest part (or, without parts, its start) is younger than that."""
    bucket = ceph_s3.new_bucket("sweep-live")
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    tier: Tier = validate_storage_config({"tiers": {"t": {
        "kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": "releases",
        "s3_region": ceph_s3.region, "credentials": {"file": str(credentials)}}}}).tier("t")
    fs = ceph_s3.filesystem()
    live = _start_upload(fs, bucket, "releases/r1/shard-000000.tar")  # a writer storing parts right now
    assert tier.sweep_partials(tier.uri("r1"), older_than=STALE_PARTIAL_S) == 0
    assert _uploads(fs, bucket) == {"releases/r1/shard-000000.tar": live}
    assert _parts(fs, bucket, "releases/r1/shard-000000.tar", live) == [1]

    # started 6 s ago: one upload stored no part since (a stuck or killed writer), one stored a part just now
    idle = str(fs.call_s3("create_multipart_upload", Bucket=bucket, Key="releases/r1/shard-000001.tar")["UploadId"])
    writing = _start_upload(fs, bucket, "releases/r1/shard-000002.tar")
    time.sleep(6)
    fs.call_s3("upload_part", Bucket=bucket, Key="releases/r1/shard-000002.tar", UploadId=writing, PartNumber=2,
               Body=b"z" * (5 * 2**20))
    assert tier.sweep_partials(tier.uri("r1"), older_than=4) == 2  # the first (its part now 6 s old) and the idle one
    assert _uploads(fs, bucket) == {"releases/r1/shard-000002.tar": writing}

    assert tier.sweep_partials(tier.uri("r1"), older_than=0) == 1  # an hour later (or no writer can be there)
    assert _uploads(fs, bucket) == {}
