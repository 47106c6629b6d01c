"""A ceph tier whose bucket does not exist, on the real Ceph RGW: a write names the bucket, the field and the fix
(s3fs raises ``FileNotFoundError(None)`` there, which printed as ``cannot write URI: None``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from datahub.errors import StorageError
from datahub.storage import validate_storage_config
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401

pytestmark = pytest.mark.ceph


def test_a_write_to_a_missing_bucket_names_the_bucket_and_the_field(ceph_s3: S3Endpoint,  # noqa: F811
                                                                     tmp_path: Path) -> None:
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    bucket = f"never-made-{uuid.uuid4().hex[:12]}"
    tier = validate_storage_config({"tiers": {"archive": {
        "kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": "releases",
        "s3_region": ceph_s3.region, "credentials": {"file": str(credentials)}}}}).tier("archive")
    uri = tier.uri("r1", "shard-000000.tar")
    expected = (rf"tier archive: cannot write {uri}: bucket '{bucket}' does not exist on {ceph_s3.endpoint_url}; "
                rf"create it .*s3 mb s3://{bucket}\), or fix tiers\.archive\.bucket in the storage config$")
    with pytest.raises(StorageError, match=expected):
        tier.publish(uri, b"shard bytes")  # one PUT
    with pytest.raises(StorageError, match=expected):
        tier.publish_stream(uri, iter([b"x" * (9 * 2**20)]), size=None, sha256=None)  # a multipart upload
