"""HDFS tier publish: temp file + RENAME with renameoptions=OVERWRITE, so a replaced file never goes missing.

Runs against the WebHDFS-protocol test server (tests/servers/webhdfs.py); no NameNode can be installed here.
"""

from __future__ import annotations

import threading

import pytest

from datahub.errors import StorageError
from datahub.storage import validate_storage_config
from tests.servers.webhdfs import WebHdfsServer


@pytest.fixture
def hdfs_tier(tmp_path):
    with WebHdfsServer(tmp_path / "hdfs-data") as server:
        config = validate_storage_config({"tiers": {"hdfs": {"kind": "hdfs", "url": server.url("/releases"),
                                                             "user": "datahub"}}})
        yield server, config.tier("hdfs")


def test_republishing_replaces_in_one_rename_and_readers_never_see_it_missing(hdfs_tier) -> None:
    server, tier = hdfs_tier
    uri = tier.uri("r1", "manifest.json")
    tier.publish(uri, b"version 0")
    missing: list[int] = []
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader() -> None:
        local = server.local("/releases/r1/manifest.json")
        while not stop.is_set():
            try:
                seen.add(local.read_bytes())
            except FileNotFoundError:
                missing.append(1)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for version in range(1, 25):
            tier.publish(uri, f"version {version}".encode())
    finally:
        stop.set()
        thread.join()
    assert tier.read(uri) == b"version 24"
    assert missing == [] and len(seen) > 1  # the reader saw several versions, never no file
    assert server.ops["DELETE"] == 0 and server.ops["RENAME"] == 25
    leftovers = [p.name for p in server.local("/releases/r1").iterdir() if p.name != "manifest.json"]
    assert leftovers == []  # no .partial temp files left behind


def test_a_refused_rename_is_a_storage_error_not_silence(hdfs_tier) -> None:
    server, tier = hdfs_tier
    server.local("/releases/r2/manifest.json").mkdir(parents=True)  # a directory where the file should go
    with pytest.raises(StorageError, match=r"tier hdfs: cannot write .*manifest\.json"):
        tier.publish(tier.uri("r2", "manifest.json"), b"{}")
    assert [p.name for p in server.local("/releases/r2").iterdir()] == ["manifest.json"]  # the temp file is removed


def test_a_hung_datanode_times_out_instead_of_blocking(tmp_path) -> None:
    """fsspec's WebHDFS client sends requests without a timeout; the tier's read_timeout_s bounds them."""
    import time

    with WebHdfsServer(tmp_path / "hdfs-data") as server:
        config = validate_storage_config({"tiers": {"hdfs": {"kind": "hdfs", "url": server.url("/releases"),
                                                             "user": "datahub", "read_timeout_s": 0.5}}})
        tier = config.tier("hdfs")
        uri = tier.uri("r1", "shard-000000.tar")
        tier.publish(uri, b"x" * 1000)
        assert tier.read(uri) == b"x" * 1000
        server.stall_ops["datanode:OPEN"] = 5.0  # the DataNode accepts the read and does not answer
        started = time.monotonic()
        with pytest.raises(StorageError, match=r"tier hdfs: cannot read .*shard-000000\.tar"):
            tier.read(uri)
        assert time.monotonic() - started < 4.0
        server.stall_ops.clear()
        assert tier.read(uri) == b"x" * 1000


def test_hdfs_timeouts_are_validated() -> None:
    from datahub.errors import SpecError

    with pytest.raises((SpecError, ValueError), match="read_timeout_s"):
        validate_storage_config({"tiers": {"hdfs": {"kind": "hdfs", "url": "webhdfs://nn:9870/r",
                                                    "read_timeout_s": 0}}})
