"""Our tar index agrees with tarfile and webdataset; the webdataset library reads our shard layout."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from datahub.errors import IntegrityError
from datahub.loader.tar_index import index_tar
from tests.loader.shards import all_ids, write_release


def test_index_matches_tarfile(tmp_path: Path) -> None:
    manifest = write_release(tmp_path, samples_per_shard=(6,), with_binary=True)
    path = manifest["shards"][0]["replicas"]["cfs"]
    data = Path(path).read_bytes()
    index = index_tar(data)
    assert index.keys == all_ids(manifest)
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            key, ext = member.name.split(".", 1)
            offset, size = index.members[index.keys.index(key)][ext]
            assert data[offset : offset + size] == tar.extractfile(member).read()  # type: ignore[union-attr]


def test_long_names_pax_and_gnu(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    long_key = "d" * 90 + "/" + "a" * 120
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
            for ext, payload in (("txt", b"hello"), ("json", b"{}")):
                info = tarfile.TarInfo(f"{long_key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
        index = index_tar(buffer.getvalue())
        assert index.keys == [long_key]
        offset, size = index.members[0]["txt"]
        assert buffer.getvalue()[offset : offset + size] == b"hello"


def test_truncated_shard_is_an_integrity_error(tmp_path: Path) -> None:
    manifest = write_release(tmp_path, samples_per_shard=(3,), text_bytes=2000)
    data = Path(manifest["shards"][0]["replicas"]["cfs"]).read_bytes()
    with pytest.raises(IntegrityError, match="runs past the end"):
        index_tar(data[:1500], where="x.tar")


def test_webdataset_library_reads_the_fixture_shards(tmp_path: Path) -> None:
    webdataset = pytest.importorskip("webdataset")
    manifest = write_release(tmp_path, samples_per_shard=(4, 3))
    urls = [shard["replicas"]["cfs"] for shard in manifest["shards"]]
    samples = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == all_ids(manifest)
    assert all(set(s) >= {"txt", "json"} for s in samples)
