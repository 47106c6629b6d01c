"""Index a tar shard held in one bytes buffer: sample keys and member (offset, size) slices.

Parsing the 512-byte headers ourselves is far cheaper than ``tarfile``'s per-member objects,
and the index gives O(1) random access to any sample of the shard (used for shuffling and
for resuming mid-shard). Supports ustar (incl. the 155-byte name prefix), GNU long names
('L') and pax ('x') path records; the export contract only needs plain ustar.
"""

from __future__ import annotations

from dataclasses import dataclass

from datahub.errors import IntegrityError

BLOCK = 512
_REGULAR = (0x30, 0x00, 0x37)  # '0', NUL, '7'
_GNU_LONGNAME, _PAX, _PAX_GLOBAL = 0x4C, 0x78, 0x67  # 'L', 'x', 'g'


@dataclass(frozen=True, slots=True)
class ShardIndex:
    """``keys[i]`` is sample i's key; ``members[i]`` maps extension -> (offset, size) in the buffer."""

    keys: list[str]
    members: list[dict[str, tuple[int, int]]]

    def __len__(self) -> int:
        return len(self.keys)


def _octal(field: bytes, where: str) -> int:
    field = field.rstrip(b"\x00 ").lstrip(b" ")
    if not field:
        return 0
    if field[0] & 0x80:  # GNU base-256 for sizes >= 8 GiB
        return int.from_bytes(field, "big") & ~(0x80 << (8 * (len(field) - 1)))
    try:
        return int(field, 8)
    except ValueError:
        raise IntegrityError(f"{where}: tar header has a non-octal size field {field!r}") from None


def _pax_path(record: bytes) -> str | None:
    for line in record.split(b"\n"):
        _, _, keyval = line.partition(b" ")
        key, _, value = keyval.partition(b"=")
        if key == b"path":
            return value.decode("utf-8")
    return None


def index_tar(buffer: bytes | memoryview, *, where: str = "shard") -> ShardIndex:
    """Group consecutive regular members by key (the basename up to its first dot), webdataset-style."""
    buf = bytes(buffer) if isinstance(buffer, memoryview) else buffer
    end = len(buf)
    keys: list[str] = []
    members: list[dict[str, tuple[int, int]]] = []
    current_key: str | None = None
    current: dict[str, tuple[int, int]] = {}
    long_name: str | None = None
    offset = 0
    find = buf.find
    while offset + BLOCK <= end:
        if buf[offset] == 0 and buf.count(0, offset, offset + BLOCK) == BLOCK:
            break  # end-of-archive marker
        header = offset
        nul = find(b"\x00", header, header + 100)
        name_bytes = buf[header : (nul if nul >= 0 else header + 100)]
        try:  # fast path: 11 octal digits then NUL, as tarfile and GNU tar write
            size = int(buf[header + 124 : header + 135], 8)
        except ValueError:
            size = _octal(buf[header + 124 : header + 136], where)
        typeflag = buf[header + 156]
        data = header + BLOCK
        if data + size > end:
            raise IntegrityError(f"{where}: tar member at byte {header} runs past the end of the shard")
        offset = data + ((size + BLOCK - 1) // BLOCK) * BLOCK
        if typeflag == _GNU_LONGNAME:
            long_name = buf[data : data + size].rstrip(b"\x00").decode("utf-8")
            continue
        if typeflag == _PAX or typeflag == _PAX_GLOBAL:
            if typeflag == _PAX:
                long_name = _pax_path(buf[data : data + size]) or long_name
            continue
        if typeflag not in _REGULAR:
            long_name = None
            continue
        if long_name is not None:
            name = long_name
            long_name = None
        else:
            name = name_bytes.decode("utf-8")
            if buf[header + 345] != 0 and buf[header + 257 : header + 262] == b"ustar":
                prefix_end = find(b"\x00", header + 345, header + 500)
                prefix = buf[header + 345 : prefix_end if prefix_end >= 0 else header + 500]
                if prefix:
                    name = prefix.decode("utf-8") + "/" + name
        slash = name.rfind("/")
        dot = name.find(".", slash + 1)
        if dot < 0:
            continue  # a member without an extension belongs to no sample field
        key = name[:dot]
        if key != current_key:
            if current_key is not None:
                keys.append(current_key)
                members.append(current)
            current_key = key
            current = {}
        current[name[dot + 1 :]] = (data, size)
    if current_key is not None:
        keys.append(current_key)
        members.append(current)
    return ShardIndex(keys, members)
