"""The ustar writer: fixed headers, validated names, readable by tarfile and GNU tar."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from datahub.errors import IntegrityError
from datahub.shards.tar import BLOCK, RECORD, check_key, end_of_archive, header, member_bytes, member_name


def _archive(members: list[tuple[str, bytes]]) -> bytes:
    body = b"".join(member_bytes(name, data) for name, data in members)
    return body + end_of_archive(len(body))


def test_tarfile_reads_names_sizes_and_fixed_metadata() -> None:
    data = _archive([("abc.txt", b"hello"), ("abc.json", b"{}"), ("def.txt", b"x" * 1000)])
    assert len(data) % RECORD == 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        infos = tar.getmembers()
        assert [(i.name, i.size) for i in infos] == [("abc.txt", 5), ("abc.json", 2), ("def.txt", 1000)]
        assert {(i.mtime, i.uid, i.gid, i.uname, i.mode) for i in infos} == {(0, 0, 0, "datahub", 0o644)}
        assert tar.extractfile("def.txt").read() == b"x" * 1000


def test_header_matches_tarfile_checksum_rule() -> None:
    block = header("k1.txt", 12345)
    assert len(block) == BLOCK
    info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")  # raises on a bad checksum
    assert (info.name, info.size, info.type) == ("k1.txt", 12345, tarfile.REGTYPE)


def test_gnu_tar_lists_the_archive(tmp_path) -> None:
    path = tmp_path / "s.tar"
    path.write_bytes(_archive([("k.txt", b"a"), ("k.json", b"{}")]))
    listing = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True).stdout.split()
    assert listing == ["k.txt", "k.json"]


@pytest.mark.parametrize("key", ["a.b", "a/b", "..", "", "x\ny", "x\x00", "é", "k" * 91])
def test_bad_keys_are_refused(key: str) -> None:
    with pytest.raises(IntegrityError, match="not a valid shard key"):
        check_key(key)


@pytest.mark.parametrize("name", ["../x.txt", "a/b.txt", "x\x01.txt"])
def test_header_refuses_names_that_could_escape(name: str) -> None:
    with pytest.raises(IntegrityError, match="not allowed"):
        header(name, 1)


def test_member_name_validates_both_parts() -> None:
    assert member_name("ab-1_c", "json") == "ab-1_c.json"
    with pytest.raises(IntegrityError, match="extension"):
        member_name("ab", "Tx.t")
