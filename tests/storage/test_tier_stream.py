"""Tier.publish_stream (what tier copies write through) and the bandwidth cap they share.

publish_stream holds one chunk at a time and publishes only bytes that match the expected size and sha256: on
a mismatch, or when the source fails half-way, nothing appears at the URI and no temp file or multipart upload
is left. Runs on cfs, on the WebHDFS-protocol test server and on the real Ceph RGW.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from datahub.errors import IntegrityError, StorageError
from datahub.storage import validate_storage_config
from datahub.storage.bandwidth import BandwidthCap
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.servers.webhdfs import WebHdfsServer

DATA = os.urandom(12 * 2**20 + 777)  # over one 8 MiB part: a multipart upload on Ceph
CHUNK = 4 * 2**20


def _chunks(data: bytes, *, fail_after: int | None = None) -> Iterator[bytes]:
    for count, start in enumerate(range(0, len(data), CHUNK)):
        if fail_after is not None and count == fail_after:
            raise ConnectionError("source replica went away")
        yield data[start:start + CHUNK]


@pytest.fixture(params=["cfs", "hdfs", pytest.param("ceph", marks=pytest.mark.ceph)])
def tier(request, tmp_path: Path):
    if request.param == "cfs":
        yield validate_storage_config({"tiers": {"t": {"kind": "cfs", "path": str(tmp_path / "cfs")}}}).tier("t")
    elif request.param == "hdfs":
        with WebHdfsServer(tmp_path / "hdfs-data") as server:
            yield validate_storage_config({"tiers": {"t": {"kind": "hdfs", "url": server.url("/releases"),
                                                           "user": "datahub"}}}).tier("t")
    else:
        endpoint: S3Endpoint = request.getfixturevalue("ceph_s3")
        credentials = tmp_path / "ceph.credentials"
        credentials.write_text(f"access_key_id={endpoint.key}\nsecret_access_key={endpoint.secret}\n")
        yield validate_storage_config({"tiers": {"t": {
            "kind": "ceph", "endpoint_url": endpoint.endpoint_url, "bucket": endpoint.new_bucket("stream"),
            "prefix": "releases", "s3_region": endpoint.region, "credentials": {"file": str(credentials)}}}}).tier("t")


def _leftovers(tier, uri: str) -> list[str]:
    """Temp files next to ``uri`` (cfs, hdfs) or unfinished multipart uploads in the bucket (ceph)."""
    fs = tier.filesystem()
    if tier.kind == "ceph":
        bucket = tier.root_uri[len("s3://"):].split("/", 1)[0]
        return [u["Key"] for u in fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])]
    parent = tier._path(uri).rsplit("/", 1)[0]
    fs.invalidate_cache()
    return [p for p in fs.ls(parent, detail=False) if ".partial-" in p] if fs.exists(parent) else []


def test_publish_stream_publishes_matching_bytes_only(tier) -> None:
    uri = tier.uri("r1", "shard-000000.tar")
    digest = hashlib.sha256(DATA).hexdigest()
    with pytest.raises(IntegrityError, match="do not match"):
        tier.publish_stream(uri, _chunks(DATA[:-1] + b"x"), size=len(DATA), sha256=digest)
    assert tier.size(uri) is None and _leftovers(tier, uri) == []
    with pytest.raises(ConnectionError):
        tier.publish_stream(uri, _chunks(DATA, fail_after=2), size=len(DATA), sha256=digest)
    assert tier.size(uri) is None and _leftovers(tier, uri) == []

    tier.publish_stream(uri, _chunks(DATA), size=len(DATA), sha256=digest)
    assert tier.verify(uri, size=len(DATA), sha256=digest) and _leftovers(tier, uri) == []
    assert tier.read_range(uri, 5, 105) == DATA[5:105]
    assert b"".join(tier.chunks(uri)) == DATA



def test_publish_stream_without_expectations_returns_the_size_and_sha256_it_wrote(tier) -> None:
    """A writer that makes the bytes as it streams them (the token export) has the tier hash them on the way: what
    comes back is the published object's size and sha256; a failing source still publishes nothing."""
    uri = tier.uri("r1", "tokens.bin")
    with pytest.raises(ConnectionError):
        tier.publish_stream(uri, _chunks(DATA, fail_after=1), size=None, sha256=None)
    assert tier.size(uri) is None and _leftovers(tier, uri) == []
    assert tier.publish_stream(uri, _chunks(DATA), size=None, sha256=None) == \
        (len(DATA), hashlib.sha256(DATA).hexdigest())
    assert tier.verify(uri, size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest())
    with pytest.raises(IntegrityError, match="do not match"):  # a size alone is still checked
        tier.publish_stream(tier.uri("r1", "other.bin"), _chunks(DATA), size=len(DATA) - 1, sha256=None)

class _FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_bandwidth_cap_holds_the_average_after_one_second_of_burst() -> None:
    time = _FakeTime()
    cap = BandwidthCap(1000, clock=time.clock, sleep=time.sleep)
    moved = sum(len(c) for c in cap.metered(b"x" * 250 for _ in range(40)))  # 10,000 bytes at 1,000 B/s
    assert moved == 10_000
    assert time.now == pytest.approx(9.0)  # the first second's bytes go at once (the burst), the rest at the cap
    assert time.slept == pytest.approx([0.25] * 36)  # then each 250-byte chunk waits its quarter second

    shared = BandwidthCap(1000, clock=time.clock, sleep=time.sleep)
    start = time.now
    for _ in range(8):  # two copies taking turns share one cap: together they get 1,000 B/s
        shared.take(250)
        shared.take(250)
    assert time.now - start == pytest.approx(3.0)
    with pytest.raises(ValueError, match="> 0"):
        BandwidthCap(0)


@pytest.mark.ceph
def test_ceph_upload_failing_at_completion_leaves_no_parts(ceph_s3: S3Endpoint, tmp_path: Path,  # noqa: F811
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The last part and the completion run in close(): when that fails the multipart upload is aborted too."""
    import s3fs

    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    tier = validate_storage_config({"tiers": {"t": {
        "kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": ceph_s3.new_bucket("close"),
        "prefix": "releases", "s3_region": ceph_s3.region, "credentials": {"file": str(credentials)}}}}).tier("t")
    uri = tier.uri("r1", "shard-000000.tar")

    def completion_fails(self: object) -> None:
        raise ConnectionError("connection reset while completing the upload")

    monkeypatch.setattr(s3fs.core.S3File, "commit", completion_fails)
    with pytest.raises(StorageError, match="completing"):
        tier.publish_stream(uri, _chunks(DATA), size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest())
    monkeypatch.undo()
    assert tier.size(uri) is None and _leftovers(tier, uri) == []
