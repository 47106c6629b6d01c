"""cfs publish with O_DIRECT (the tier's ``direct_io``): the same bytes as a buffered write, past the page cache,
aligned direct writes with a buffered tail, and a buffered fallback where the filesystem refuses O_DIRECT."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import mmap
import os
import subprocess
from pathlib import Path

import pytest

import datahub.storage.tier as tier_module
from datahub.errors import StorageError
from datahub.storage import validate_storage_config

# a tar-like length: a multiple of 10240 (tar's record) that is not one of 4096, so the file has an unaligned tail
SIZE = 10240 * 1337
PAGE = mmap.PAGESIZE


def _tier(root: Path, direct_io: str | None = None):
    spec = {"kind": "cfs", "path": str(root), **({"direct_io": direct_io} if direct_io else {})}
    return validate_storage_config({"tiers": {"t": spec}}).tier("t")


def _aligned(data: bytes) -> memoryview:
    """``data`` in page-aligned memory (an anonymous mapping), as a local export's ring buffers hold shards."""
    buffer = mmap.mmap(-1, len(data))
    buffer[:] = data
    return memoryview(buffer)


def _resident_pages(path: str) -> int:
    """How many of the file's pages are in the page cache (mincore over a private mapping, which reads nothing)."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        pages = (size + PAGE - 1) // PAGE
        vector = (ctypes.c_ubyte * pages)()
        holder = ctypes.c_char.from_buffer(mapping)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mincore(ctypes.c_void_p(ctypes.addressof(holder)), ctypes.c_size_t(size), vector) == 0
        del holder
        return sum(byte & 1 for byte in vector)
    finally:
        mapping.close()


@pytest.fixture
def block_fs(tmp_path) -> None:
    """Tests that expect ``direct_io: auto`` to write directly need tmp_path on a local block-device filesystem."""
    if not tier_module._direct_by_default(str(tmp_path)):
        pytest.skip(f"{tmp_path} is on {tier_module._filesystem_type(str(tmp_path))}: auto writes buffered there")


class _WriteLog:
    """Records every os.write: file offset, length, whether O_DIRECT was set, and the source address."""

    def __init__(self, monkeypatch, *, refuse_direct: bool = False) -> None:
        self.writes: list[tuple[int, int, bool, int | None]] = []
        real = os.write

        def write(fd: int, data) -> int:
            direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
            view = memoryview(data)
            if direct and refuse_direct:  # a filesystem that takes the flag but refuses the write
                raise OSError(errno.EINVAL, "Invalid argument")
            self.writes.append((os.lseek(fd, 0, os.SEEK_CUR), len(view), direct, tier_module._address(view)))
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)

    @property
    def direct(self) -> list[tuple[int, int, bool, int | None]]:
        return [w for w in self.writes if w[2]]


@pytest.mark.parametrize("source", ["bytes", "aligned"])
def test_direct_publish_writes_the_same_bytes_past_the_page_cache(block_fs, tmp_path, source) -> None:
    data = os.urandom(SIZE)
    target, buffered = _tier(tmp_path / "direct"), _tier(tmp_path / "buffered", "off")
    uri, plain = target.uri("rel", "shard.tar"), buffered.uri("rel", "shard.tar")
    target.publish(uri, _aligned(data) if source == "aligned" else data)
    buffered.publish(plain, data)
    assert hashlib.sha256(Path(uri).read_bytes()).digest() == hashlib.sha256(Path(plain).read_bytes()).digest() \
        == hashlib.sha256(data).digest()
    # only the tail page went through the page cache (the reads above go to a new mapping's pages: read it first)
    fresh = target.uri("rel", "fresh.tar")
    target.publish(fresh, _aligned(data) if source == "aligned" else data)
    assert _resident_pages(fresh) <= 1
    assert not [p for p in Path(uri).parent.iterdir() if p.name not in ("shard.tar", "fresh.tar")]


def test_direct_writes_are_aligned_pieces_and_the_tail_is_buffered(block_fs, tmp_path, monkeypatch) -> None:
    data = os.urandom(SIZE)
    log = _WriteLog(monkeypatch)
    target = _tier(tmp_path / "cfs")
    target.publish(target.uri("rel", "a.tar"), _aligned(data))
    head = SIZE - SIZE % 4096
    assert [(offset, length) for offset, length, _, _ in log.direct] == [
        (offset, min(tier_module._DIRECT_PIECE, head - offset)) for offset in range(0, head, tier_module._DIRECT_PIECE)]
    assert all(address is not None and address % PAGE == 0 for *_, address in log.direct)
    assert [(offset, length, direct) for offset, length, direct, _ in log.writes[len(log.direct):]] == [
        (head, SIZE - head, False)]
    assert Path(target.uri("rel", "a.tar")).read_bytes() == data


def test_unaligned_memory_goes_direct_through_an_aligned_bounce_buffer(block_fs, tmp_path, monkeypatch) -> None:
    data = os.urandom(SIZE)
    log = _WriteLog(monkeypatch)
    target = _tier(tmp_path / "cfs")
    target.publish(target.uri("rel", "a.tar"), memoryview(bytearray(b"x" + data))[1:])  # one byte past alignment
    assert len(log.direct) == -(-(SIZE - SIZE % 4096) // tier_module._DIRECT_PIECE)
    assert all(address is not None and address % PAGE == 0 for *_, address in log.direct)
    assert Path(target.uri("rel", "a.tar")).read_bytes() == data


def test_small_objects_and_direct_io_off_are_written_buffered(tmp_path, monkeypatch) -> None:
    log = _WriteLog(monkeypatch)
    data = os.urandom(SIZE)
    _tier(tmp_path / "auto").publish(str(tmp_path / "auto" / "small.json"), b"{}" * 1000)
    off = _tier(tmp_path / "off", "off")
    off.publish(off.uri("rel", "a.tar"), _aligned(data))
    assert log.writes and not log.direct
    assert Path(off.uri("rel", "a.tar")).read_bytes() == data


def test_a_refused_direct_write_falls_back_to_buffered_or_fails_when_required(block_fs, tmp_path, monkeypatch) -> None:
    """Some filesystems take the O_DIRECT flag and refuse the write (EINVAL): auto writes buffered, on says so."""
    data = os.urandom(SIZE)
    log = _WriteLog(monkeypatch, refuse_direct=True)
    auto = _tier(tmp_path / "auto")
    auto.publish(auto.uri("rel", "a.tar"), _aligned(data))
    assert Path(auto.uri("rel", "a.tar")).read_bytes() == data and not log.direct
    required = _tier(tmp_path / "on", "on")
    with pytest.raises(StorageError, match="O_DIRECT"):
        required.publish(required.uri("rel", "a.tar"), _aligned(data))
    assert not list(Path(required.uri("rel")).iterdir())  # no temp file left, nothing published


def test_tmpfs_publishes_the_same_bytes(monkeypatch) -> None:
    """/dev/shm (tmpfs) refuses O_DIRECT before Linux 6.6 and takes it since: a publish works either way."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    import tempfile

    data = os.urandom(SIZE)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        target = _tier(Path(root))
        target.publish(target.uri("rel", "a.tar"), _aligned(data))
        assert Path(target.uri("rel", "a.tar")).read_bytes() == data


@pytest.fixture
def ramfs(tmp_path):
    """A ramfs mount (refuses O_DIRECT when the flag is set); needs root, skipped elsewhere."""
    mount = tmp_path / "ramfs"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a ramfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_filesystem_that_refuses_o_direct_still_publishes(ramfs) -> None:
    data = os.urandom(SIZE)
    auto = _tier(ramfs / "auto")
    auto.publish(auto.uri("rel", "a.tar"), _aligned(data))
    assert Path(auto.uri("rel", "a.tar")).read_bytes() == data
    required = _tier(ramfs / "on", "on")
    with pytest.raises(StorageError, match="refuses O_DIRECT"):
        required.publish(required.uri("rel", "a.tar"), _aligned(data))
    assert not list(Path(required.uri("rel")).iterdir())


def test_auto_writes_buffered_on_tmpfs_and_on_network_filesystems(monkeypatch, tmp_path) -> None:
    """auto goes direct only on a local block-device filesystem: NFS (CFS) would wait for the server on every
    direct write; tmpfs has no device behind it. A mount point with a space is read as /proc/mounts escapes it."""
    table = tmp_path / "mounts"
    table.write_text("/dev/vda / ext4 rw 0 0\n"
                     "server:/export /mnt/cfs\\040data nfs4 rw,vers=4.1 0 0\n"
                     "tmpfs /dev/shm tmpfs rw 0 0\n"
                     "/dev/vdb /mnt/cfs\\040data/local xfs rw 0 0\n")
    kind = tier_module._filesystem_type
    assert kind("/mnt/cfs data/releases", str(table)) == "nfs4"
    assert kind("/mnt/cfs data", str(table)) == "nfs4"
    assert kind("/mnt/cfs datax", str(table)) == "ext4"  # a name that only starts like the mount point
    assert kind("/mnt/cfs data/local/x", str(table)) == "xfs"
    assert kind("/dev/shm/x", str(table)) == "tmpfs"
    if not os.path.isdir("/dev/shm") or tier_module._filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm here")
    import tempfile

    log = _WriteLog(monkeypatch)
    data = os.urandom(SIZE)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        target = _tier(Path(root))
        target.publish(target.uri("rel", "a.tar"), _aligned(data))
        assert Path(target.uri("rel", "a.tar")).read_bytes() == data
    assert log.writes and not log.direct
