"""Our tar index agrees with tarfile and webdataset; the webdataset library reads our shard layout."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from datahub.errors import IntegrityError
from datahub.shards.index import _index_general, _index_plain_ustar, index_tar
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


def _tar(members: list[tuple[str, bytes] | tarfile.TarInfo], fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            name, payload = member
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _as_dicts(index) -> tuple[list[str], list[dict[str, tuple[int, int]]]]:
    return index.keys, index.members


def _directory(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


ODD_LAYOUTS = {
    "export layout": [("000a.txt", b"alpha"), ("000a.json", b"{}"), ("000b.txt", b""), ("000b.json", b"[1]")],
    "dots in directories and keys": [("d.v1/x.y.txt", b"1"), ("d.v1/x.y.json", b"2"), ("d.v2/x.txt", b"3")],
    "members without extension and directories": [_directory("dir"), ("README", b"r"), ("k.txt", b"t"),
                                                   ("dir/", b""), ("k.bin", b"\x00" * 1000)],
    "a key that comes back later is a new sample": [("a.txt", b"1"), ("b.txt", b"2"), ("a.json", b"3")],
    "a repeated extension: the later member wins": [("a.txt", b"first"), ("a.txt", b"second!"), ("a.json", b"{}")],
    "a 100-byte name without NUL": [("n" * 96 + ".txt", b"x" * 513)],
    "long extensions": [("a.tar.gz.sha256sum", b"h"), ("a.txt", b"t")],
    "empty archive": [],
}


@pytest.mark.parametrize("layout", ODD_LAYOUTS, ids=list(ODD_LAYOUTS))
def test_vectorized_index_agrees_with_the_general_parser(layout: str) -> None:
    data = _tar(ODD_LAYOUTS[layout])
    fast = _index_plain_ustar(np.frombuffer(data, np.uint8))
    assert fast is not None, "plain ustar shards must take the vectorized path"
    general = _index_general(data, "x.tar")
    assert _as_dicts(fast) == _as_dicts(general)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # and both agree with tarfile on the bytes
        expected = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    for key, members in zip(fast.keys, fast.members):
        for ext, (offset, size) in members.items():
            assert data[offset : offset + size] == expected[f"{key}.{ext}"]


def test_archive_without_end_marker_and_with_trailing_garbage() -> None:
    data = _tar([("a.txt", b"x" * 700), ("b.txt", b"y")])
    members_end = 5 * 512  # header + 2 data blocks for a, header + 1 data block for b
    for variant in (data[:members_end], data[:members_end] + b"\x00" * 1024 + b"garbage" * 100):
        fast = _index_plain_ustar(np.frombuffer(variant, np.uint8))
        assert fast is not None and _as_dicts(fast) == _as_dicts(_index_general(variant, "x"))
        assert fast.keys == ["a", "b"]


def test_exotic_headers_fall_back_to_the_general_parser() -> None:
    long_name = "p" * 120 + ".txt"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        data = _tar([(long_name, b"hi")], fmt)
        assert _index_plain_ustar(np.frombuffer(data, np.uint8)) is None
        assert index_tar(data).keys == ["p" * 120]
    prefixed = _tar([("d" * 90 + "/" + "e" * 60 + ".txt", b"z")])  # ustar splits this name into prefix + name
    assert _index_plain_ustar(np.frombuffer(prefixed, np.uint8)) is None
    assert index_tar(prefixed).keys == ["d" * 90 + "/" + "e" * 60]
    non_ascii = _tar([("é.txt", b"z")], tarfile.GNU_FORMAT)
    assert index_tar(non_ascii).keys == ["é"]


def test_bounds_per_extension() -> None:
    data = _tar([("a.txt", b"one"), ("a.json", b"{}"), ("b.json", b"[]"), ("c.txt", b"first"), ("c.txt", b"last")])
    index = index_tar(data)
    starts, stops = index.bounds("txt")
    assert [data[s:e] if s >= 0 else None for s, e in zip(starts, stops)] == [b"one", None, b"last"]
    assert index.bounds("npy") == ([-1, -1, -1], [-1, -1, -1])


def test_damaged_size_field_is_an_integrity_error_from_both_paths() -> None:
    data = bytearray(_tar([("a.txt", b"x")]))
    data[124:135] = b"0000000zz00"
    with pytest.raises(IntegrityError, match="non-octal size"):
        index_tar(bytes(data), where="x.tar")


def _members(index) -> list[tuple[str, str, int, int]]:
    """(key, extension, offset, size) per member: comparable whatever the extension codes are."""
    return [(index.keys[s], index.extensions[e], o, z) for s, e, o, z in zip(
        index.member_sample.tolist(), index.member_ext.tolist(), index.member_offset.tolist(), index.member_size.tolist())]


def _indexed_shard(samples: int) -> tuple[bytes, int]:
    """A shard as the export writes it: members, the ``__index__`` member, end of archive; and where the index starts."""
    from datahub.shards.tar import end_of_archive, member_bytes
    from datahub.shards.index import index_member

    parts = []
    for i in range(samples):
        key = f"k{i:04d}"
        parts.append(member_bytes(f"{key}.txt", f"text {i} ".encode() * (i % 7 + 1)))
        parts.append(member_bytes(f"{key}.json", b"{}"))
        if i % 3 == 0:
            parts.append(member_bytes(f"{key}.png", bytes(range(256)) * (i % 4)))
    members = b"".join(parts)
    embedded = index_member(_index_plain_ustar(np.frombuffer(members, np.uint8)), len(members))  # type: ignore[arg-type]
    assert embedded
    return members + embedded + end_of_archive(len(members) + len(embedded)), len(members)


def test_embedded_index_equals_a_scan_of_the_members_and_tarfile_webdataset_skip_nothing_else() -> None:
    from datahub.shards.index import _index_embedded

    data, _ = _indexed_shard(40)
    embedded = _index_embedded(np.frombuffer(data, np.uint8))
    assert embedded is not None  # index_tar takes this path for exported shards
    assert _members(embedded) == _members(_index_general(data, "x.tar")) == _members(index_tar(data))
    assert embedded.keys == [f"k{i:04d}" for i in range(40)]
    assert embedded.bounds("png")[0][1] == -1 and embedded.bounds("png")[0][0] >= 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
    assert names[-1] == "__index__" and len(names) == 40 * 2 + 14 + 1


def test_a_damaged_or_foreign_embedded_index_is_not_trusted() -> None:
    """Only an index whose sizes match every member header is used; otherwise the headers are parsed."""
    from datahub.shards.index import _index_embedded

    data, index_start = _indexed_shard(12)
    scanned = _members(_index_general(data, "x.tar"))
    payload = index_start + 512
    damaged = []
    size_in_index = bytearray(data)  # the index says member 3 is one byte longer than its header does
    size_in_index[payload + 3 * 8] += 1
    damaged.append(size_in_index)
    size_in_header = bytearray(data)  # a member header changed after the index was written
    size_in_header[512 + 512 + 134] = ord("7") if size_in_header[512 + 512 + 134] != ord("7") else ord("6")
    damaged.append(size_in_header)
    magic = bytearray(data)
    magic[data.rstrip(b"\0").__len__() - 1] ^= 0xFF
    damaged.append(magic)
    count = bytearray(data)  # the trailer's member count
    count[len(data.rstrip(b"\0")) - 40] += 1
    damaged.append(count)
    for broken in damaged:
        assert _index_embedded(np.frombuffer(bytes(broken), np.uint8)) is None
    for broken in damaged[2:]:  # members untouched: the scan gives the same index
        assert _members(index_tar(bytes(broken))) == scanned


def test_index_member_refuses_members_that_are_not_back_to_back() -> None:
    from datahub.shards.tar import member_bytes
    from datahub.shards.index import index_member

    members = member_bytes("a.txt", b"x") + member_bytes("noext", b"y") + member_bytes("b.txt", b"z")
    index = _index_general(members, "x.tar")
    assert index.keys == ["a", "b"]
    assert index_member(index, len(members)) == b""  # the member without an extension has no place in it


@pytest.mark.parametrize("samples", [1, 12, 400])
def test_embedded_keys_read_only_the_tail_and_equal_the_full_index(samples: int) -> None:
    """``embedded_keys`` gives the keys of ``index_tar`` from ranged reads of the archive's end (the tier copy's
    lineage index); a shard without an index, or with a damaged trailer, gives None (the caller reads it whole)."""
    from datahub.shards.index import INDEX_TAIL_BYTES, embedded_keys
    from datahub.shards.tar import end_of_archive, member_bytes

    data, index_start = _indexed_shard(samples)
    reads: list[tuple[int, int]] = []

    def read_range(start: int, end: int) -> bytes:
        reads.append((start, end))
        return data[start:end]

    keys = embedded_keys(read_range, len(data))
    assert keys == index_tar(data).keys == [f"k{i:04d}" for i in range(samples)]
    assert len(reads) <= 2 and reads[0] == (max(0, len(data) - INDEX_TAIL_BYTES), len(data))
    assert sum(end - start for start, end in reads) <= len(data) - index_start + INDEX_TAIL_BYTES

    plain = b"".join(member_bytes(f"k{i}.txt", b"x") for i in range(3))
    plain += end_of_archive(len(plain))
    assert embedded_keys(lambda s, e: plain[s:e], len(plain)) is None
    broken = bytearray(data)
    broken[len(data.rstrip(b"\0")) - 1] ^= 0xFF  # the magic
    assert embedded_keys(lambda s, e: bytes(broken[s:e]), len(broken)) is None
    assert embedded_keys(lambda s, e: data[s:e][:-1], len(data)) is None  # a short read
