"""Real round trips against the single-host Ceph cluster's radosgw (started by .ci/ceph.sh)."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest

from tests.ceph import S3Endpoint, ceph_s3, start_rgw, stop_rgw  # noqa: F401

pytestmark = pytest.mark.ceph


def _rows(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table({"sample_id": [f"s{i:06d}" for i in ids], "text": [f"doc {i}" * 8 for i in ids]})


def test_s3fs_put_get_list_round_trip(ceph_s3: S3Endpoint) -> None:
    bucket = ceph_s3.new_bucket("roundtrip")
    fs = ceph_s3.filesystem()
    big = os.urandom(7 * 1024 * 1024 + 123)  # over one 5 MiB part, so the upload is multipart
    with fs.open(f"{bucket}/blobs/big.bin", "wb", block_size=5 * 1024 * 1024) as handle:
        handle.write(big)
    fs.pipe({f"{bucket}/blobs/small-{i}.txt": f"small {i}".encode() for i in range(3)})

    assert fs.cat(f"{bucket}/blobs/big.bin") == big
    assert fs.cat(f"{bucket}/blobs/small-1.txt") == b"small 1"
    assert fs.cat_file(f"{bucket}/blobs/big.bin", start=1000, end=2000) == big[1000:2000]
    listed = sorted(fs.ls(f"{bucket}/blobs", detail=False, refresh=True))
    assert listed == [f"{bucket}/blobs/big.bin"] + [f"{bucket}/blobs/small-{i}.txt" for i in range(3)]
    assert fs.info(f"{bucket}/blobs/big.bin")["size"] == len(big)

    fs.rm(f"{bucket}/blobs/small-0.txt")
    assert not fs.exists(f"{bucket}/blobs/small-0.txt")


def test_deltalake_write_append_read(ceph_s3: S3Endpoint) -> None:
    from deltalake import DeltaTable, write_deltalake

    uri = f"s3://{ceph_s3.new_bucket('delta')}/t"
    options = ceph_s3.storage_options()
    write_deltalake(uri, _rows(0, 100), storage_options=options)
    write_deltalake(uri, _rows(100, 50), mode="append", storage_options=options)
    write_deltalake(uri, _rows(150, 25), mode="append", storage_options=options)

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2
    assert [entry["operation"] for entry in sorted(table.history(), key=lambda e: e["version"])] == [
        "WRITE",
        "WRITE",
        "WRITE",
    ]
    data = table.to_pyarrow_table().sort_by("sample_id")
    assert data.num_rows == 175
    assert data.column("sample_id").to_pylist() == [f"s{i:06d}" for i in range(175)]

    table.load_as_version(0)
    assert table.to_pyarrow_table().num_rows == 100


def test_deltalake_concurrent_commit_does_not_overwrite(ceph_s3: S3Endpoint) -> None:
    """Two writers on the same snapshot: radosgw's conditional put must stop the second from replacing
    the first's commit file, so delta-rs retries at the next version and no rows are lost."""
    from deltalake import DeltaTable, write_deltalake

    uri = f"s3://{ceph_s3.new_bucket('delta-race')}/t"
    options = ceph_s3.storage_options()
    write_deltalake(uri, _rows(0, 10), storage_options=options)
    writer_a = DeltaTable(uri, storage_options=options)
    writer_b = DeltaTable(uri, storage_options=options)
    write_deltalake(writer_a, _rows(10, 10), mode="append")
    write_deltalake(writer_b, _rows(20, 10), mode="append")  # was stale at version 0

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2
    assert table.to_pyarrow_table().num_rows == 30


def test_put_if_none_match_refuses_overwrite(ceph_s3: S3Endpoint) -> None:
    """The primitive behind delta-rs commits here: PUT with If-None-Match: * must not replace a key."""
    bucket = ceph_s3.new_bucket("conditional")
    fs = ceph_s3.filesystem()
    fs.call_s3("put_object", Bucket=bucket, Key="_delta_log/00000.json", Body=b"first", IfNoneMatch="*")
    with pytest.raises(OSError):  # 412 Precondition Failed, which s3fs translates to an OSError
        fs.call_s3("put_object", Bucket=bucket, Key="_delta_log/00000.json", Body=b"second", IfNoneMatch="*")
    assert fs.cat_file(f"{bucket}/_delta_log/00000.json") == b"first"


def test_rgw_restart(ceph_s3: S3Endpoint) -> None:
    bucket = ceph_s3.new_bucket("restart")
    ceph_s3.filesystem().pipe_file(f"{bucket}/before.txt", b"kept across the restart")
    quick = {"config_kwargs": {"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 1}}}

    stop_rgw()
    try:
        began = time.monotonic()
        with pytest.raises(Exception):
            ceph_s3.filesystem(retries=1, **quick).cat_file(f"{bucket}/before.txt")
        assert time.monotonic() - began < 60
    finally:
        start_rgw()

    fs = ceph_s3.filesystem()
    assert fs.cat_file(f"{bucket}/before.txt") == b"kept across the restart"
    fs.pipe_file(f"{bucket}/after.txt", b"written after the restart")
    assert sorted(fs.ls(bucket, detail=False, refresh=True)) == [f"{bucket}/after.txt", f"{bucket}/before.txt"]
