"""Index a tar shard held in one buffer: sample keys and member (offset, size) slices.

The index gives O(1) random access to any sample of the shard (used for shuffling and for
resuming mid-shard). Shards written by ``datahub export`` carry their index as the last member,
``__index__`` (see :func:`index_member`; the webdataset library skips top-level ``__*__`` members as
metadata), so reading it costs a few small array reads instead of a pass over the shard; its sizes are
checked against every member header before use, and the shard's sha256 (checked by the loader by
default) covers it. Other plain ustar shards with ASCII names (what the export contract writes) take a
vectorized path: numpy parses the size field of every 512-byte block at once, a short loop over
plain ints follows the header chain, and names are split into key and extension for all members
together. Anything else (GNU long names 'L', pax 'x'/'g' records, the 155-byte ustar prefix,
non-ASCII names, base-256 or space-padded sizes, damaged shards) takes the general per-header parser.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from datahub.errors import IntegrityError
from datahub.shards.tar import BLOCK, RECORD, member_bytes  # the one ustar header writer
INDEX_NAME = "__index__"
_INDEX_MAGIC = b"DHTIDX01"
_INDEX_TRAILER = struct.Struct("<QQQQ")  # members, key bytes, extension bytes, header block of the index member
# the archive's tail that holds the index trailer: the index payload's padding, the end-of-archive blocks and
# the padding to a full record
INDEX_TAIL_BYTES = RECORD + 3 * BLOCK
_REGULAR = (0x30, 0x00, 0x37)  # '0', NUL, '7'
_GNU_LONGNAME, _PAX, _PAX_GLOBAL = 0x4C, 0x78, 0x67  # 'L', 'x', 'g'
# bytes 120..135 of a header as two little-endian words; the size field is bytes 124..134 (11 octal digits)
_DIGITS_MASK = (np.uint64(0xF8F8F8F800000000), np.uint64(0x00F8F8F8F8F8F8F8))
_DIGITS_WANT = (np.uint64(0x3030303000000000), np.uint64(0x0030303030303030))


@dataclass(frozen=True, slots=True, eq=False)
class ShardIndex:
    """``keys[i]`` is sample i's key; member j of the shard belongs to sample ``member_sample[j]``, has
    extension ``extensions[member_ext[j]]`` and its bytes at ``[member_offset[j], +member_size[j])``."""

    keys: list[str]
    extensions: tuple[str, ...]
    member_sample: np.ndarray
    member_ext: np.ndarray
    member_offset: np.ndarray
    member_size: np.ndarray
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.keys)

    def bounds(self, extension: str) -> tuple[list[int], list[int]]:
        """Per sample, (start, stop) of its member with ``extension``; start is -1 where it has none."""
        cached = self._cache.get(extension)
        if cached is None:
            starts = np.full(len(self.keys), -1, dtype=np.int64)
            sizes = np.zeros(len(self.keys), dtype=np.int64)
            if extension in self.extensions:
                members = np.flatnonzero(self.member_ext == self.extensions.index(extension))
                samples = self.member_sample[members]
                last = np.append(samples[1:] != samples[:-1], True)  # a repeated member: the later one wins
                starts[samples[last]] = self.member_offset[members[last]]
                sizes[samples[last]] = self.member_size[members[last]]
            cached = self._cache[extension] = (starts.tolist(), (starts + sizes).tolist())
        return cached

    @property
    def members(self) -> list[dict[str, tuple[int, int]]]:
        """Per sample, extension -> (offset, size), in member order."""
        cached = self._cache.get("\0members")
        if cached is None:
            cached = [{} for _ in self.keys]
            extensions = self.extensions
            for sample, ext, offset, size in zip(self.member_sample.tolist(), self.member_ext.tolist(),
                                                 self.member_offset.tolist(), self.member_size.tolist()):
                cached[sample][extensions[ext]] = (offset, size)
            self._cache["\0members"] = cached
        return cached


def index_tar(buffer: bytes | bytearray | memoryview | mmap.mmap, *, where: str = "shard") -> ShardIndex:
    """Group consecutive regular members by key (the basename up to its first dot), webdataset-style."""
    array = np.frombuffer(buffer, dtype=np.uint8)
    index = _index_embedded(array)
    if index is not None:
        return index
    index = _index_plain_ustar(array)
    if index is not None:
        return index
    return _index_general(buffer if isinstance(buffer, bytes) else bytes(buffer), where)


def index_rows(buffer: bytes | bytearray | memoryview, row_offsets: np.ndarray, keys: list[str], *,
               where: str = "shard") -> ShardIndex:
    """The index of members written row by row, as an export writes them: row i's members are named
    ``keys[i].EXT`` and fill ``[row_offsets[i], row_offsets[i + 1])``, rows back to back. Same result as
    ``index_tar``; the headers are found by walking every row one member at a time (a numpy step per member
    position, a few per row) instead of following the header chain member by member. Anything unexpected (a
    size field that is not plain octal, a name that is not the row's key, a walk that does not end exactly at
    the row's end) takes ``index_tar``."""
    array = np.frombuffer(buffer, dtype=np.uint8)
    offsets = np.asarray(row_offsets, dtype=np.int64)
    starts, ends = offsets[:-1], offsets[1:]
    count = len(starts)
    if count != len(keys) or not count or int(offsets[0]) != 0 or int(offsets[-1]) > len(array):
        return index_tar(buffer, where=where)
    digits_at = np.arange(124, 135)
    weights = 8 ** np.arange(10, -1, -1, dtype=np.int64)
    position = starts.copy()
    rows = np.flatnonzero(position < ends)
    heads: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    while len(rows):
        at = position[rows]
        if (at + BLOCK > ends[rows]).any():
            return index_tar(buffer, where=where)
        digits = array[at[:, None] + digits_at]
        if ((digits < 0x30) | (digits > 0x37)).any() or array[at + 135].any():
            return index_tar(buffer, where=where)
        size = (digits.astype(np.int64) - 0x30) @ weights
        heads.append(at)
        owners.append(rows)
        sizes.append(size)
        position[rows] = at + BLOCK + ((size + BLOCK - 1) // BLOCK) * BLOCK
        rows = rows[position[rows] < ends[rows]]
    if not np.array_equal(position, ends):
        return index_tar(buffer, where=where)
    head = np.concatenate(heads)
    order = np.argsort(head, kind="stable")
    head, owner, size = head[order], np.concatenate(owners)[order], np.concatenate(sizes)[order]
    names = array[head[:, None] + np.arange(100)].view("S100").ravel()  # numpy strips the NUL padding
    prefixes = np.array([key + "." for key in keys], dtype="S")
    if not np.strings.startswith(names, prefixes[owner]).all():
        return index_tar(buffer, where=where)
    extensions = np.strings.slice(names, np.strings.str_len(prefixes)[owner], None)
    if not len(extensions) or (np.strings.str_len(extensions) == 0).any():
        return index_tar(buffer, where=where)
    names_of, ext_codes = _distinct(extensions.astype(f"S{max(1, int(np.strings.str_len(extensions).max()))}"))
    return ShardIndex(keys=list(keys), extensions=names_of, member_sample=owner, member_ext=ext_codes,
                      member_offset=head + BLOCK, member_size=size)


def _index_plain_ustar(array: np.ndarray) -> ShardIndex | None:
    """The vectorized path; None when the shard needs the general parser (same result, or its error)."""
    count = len(array) // BLOCK
    if count == 0:
        return _build([], [], [], [], [])
    blocks = array[: count * BLOCK].reshape(count, BLOCK)
    fields = blocks[:, 120:136].copy()  # one strided gather; the rest works on this small contiguous copy
    words = fields.view("<u8")
    plain = ((words[:, 0] & _DIGITS_MASK[0]) == _DIGITS_WANT[0]) & ((words[:, 1] & _DIGITS_MASK[1]) == _DIGITS_WANT[1])
    sizes = _octal_words(np.ascontiguousarray(words[:, 0]), np.ascontiguousarray(words[:, 1]))
    following = np.arange(1, count + 1) + ((sizes + BLOCK - 1) >> 9)
    following[~plain] = count  # stop the chain at anything but a plain header (end marker included)
    chain = following.data  # a memoryview: plain ints per lookup, no whole-array conversion
    headers = []
    block = 0
    while block < count:
        headers.append(block)
        block = chain[block]
    if block > count:
        return None  # the last member runs past the end: the general parser words the error
    last = headers[-1]
    if not plain[last]:
        if blocks[last].any():
            return None  # a header our fast parse does not cover
        headers.pop()  # the end-of-archive marker
    if not headers:
        return _build([], [], [], [], [])
    heads = np.asarray(headers, dtype=np.int64)
    header_blocks = blocks[heads]  # one gather of the headers; the checks below then read cached memory
    typeflags = header_blocks[:, 156]
    if np.isin(typeflags, (_GNU_LONGNAME, _PAX, _PAX_GLOBAL)).any():
        return None
    prefixed = header_blocks[header_blocks[:, 345] != 0]
    if len(prefixed) and (prefixed[:, 257:262] == np.frombuffer(b"ustar", np.uint8)).all(axis=1).any():
        return None  # names with a ustar prefix
    regular = np.isin(typeflags, _REGULAR)
    heads = heads[regular]
    names = header_blocks[regular, :100] if not regular.all() else np.ascontiguousarray(header_blocks[:, :100])
    if names.size and names.max() >= 0x80:
        return None  # non-ASCII names: the general parser decodes (and rejects) UTF-8
    strings = names.view("S100").ravel()  # numpy strips the NUL padding
    length = np.strings.str_len(strings)
    if np.count_nonzero(names) != int(length.sum()):  # equal only if no row has a NUL before its last byte
        return None  # a NUL inside the name field ends the name: the general parser handles it
    if len(length):
        strings = strings.astype(f"S{max(1, int(length.max()))}")  # narrow strings: the string ops below scale with width
    slash = np.strings.rfind(strings, b"/") if (names == 0x2F).any() else np.full(len(strings), -1)
    dot = np.strings.find(strings, b".", slash + 1)
    has_dot = dot >= 0  # a member without an extension belongs to no sample field
    if not has_dot.all():
        heads, strings, dot, length = heads[has_dot], strings[has_dot], dot[has_dot], length[has_dot]
    if not len(heads):
        return _build([], [], [], [], [])
    keys = np.strings.slice(strings, 0, dot)
    ext_width = max(1, int((length - dot).max()) - 1)
    extensions, ext_codes = _distinct(np.strings.slice(strings, dot + 1, None).astype(f"S{ext_width}"))
    new_sample = np.ones(len(keys), dtype=bool)
    new_sample[1:] = keys[1:] != keys[:-1]
    return ShardIndex(
        keys=[key.decode("ascii") for key in keys[new_sample].tolist()],
        extensions=extensions,
        member_sample=np.cumsum(new_sample) - 1,
        member_ext=ext_codes,
        member_offset=(heads + 1) * BLOCK,
        member_size=sizes[heads],
    )


def index_member(index: ShardIndex, members_end: int) -> bytes:
    """The ``__index__`` member (header, payload, padding) for a shard whose members, all in ``index``,
    fill ``[0, members_end)`` back to back; b"" when the index cannot be embedded (then readers scan).

    Payload, little-endian: member sizes (int64 each), extension codes (uint8 each), new-sample flags
    (uint8 each: 1 where a member starts a sample), the keys joined by newlines, the extensions joined by
    newlines, then the trailer: member count, key bytes, extension bytes, the index member's header block
    (uint64 each) and the magic ``DHTIDX01``, so a reader finds it from the end of the archive.
    """
    count = len(index.member_size)
    keys = "\n".join(index.keys)
    if (members_end % BLOCK or len(index.extensions) > 255 or not keys.isascii() or "\n" in "".join(index.keys)
            or any("\n" in ext or not ext.isascii() for ext in index.extensions)):
        return b""
    headers = _member_headers(index.member_size)
    if count and (int(headers[0]) != 0 or int(index.member_offset[0]) != BLOCK
                  or not np.array_equal(headers + BLOCK, index.member_offset)):
        return b""  # members not back to back (a skipped member): nothing to embed
    if _members_end(headers, index.member_size) != members_end:
        return b""
    new_sample = np.ones(count, dtype=np.uint8)
    new_sample[1:] = index.member_sample[1:] != index.member_sample[:-1]
    extensions = sorted(index.extensions)  # canonical: the same bytes whichever parser built the index
    recode = np.asarray([extensions.index(ext) for ext in index.extensions], dtype=np.uint8)
    key_bytes, ext_bytes = keys.encode("ascii"), "\n".join(extensions).encode("ascii")
    payload = b"".join((index.member_size.astype("<i8").tobytes(), recode[index.member_ext].tobytes(),
                        new_sample.tobytes(), key_bytes, ext_bytes,
                        _INDEX_TRAILER.pack(count, len(key_bytes), len(ext_bytes), members_end // BLOCK), _INDEX_MAGIC))
    return member_bytes(INDEX_NAME, payload)


def _member_headers(sizes: np.ndarray) -> np.ndarray:
    """Byte offsets of the headers of members of ``sizes`` stored back to back from offset 0."""
    spans = BLOCK + ((sizes + BLOCK - 1) // BLOCK) * BLOCK
    headers = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(spans[:-1], out=headers[1:])
    return headers


def _members_end(headers: np.ndarray, sizes: np.ndarray) -> int:
    if not len(sizes):
        return 0
    return int(headers[-1]) + BLOCK + ((int(sizes[-1]) + BLOCK - 1) // BLOCK) * BLOCK


@dataclass(frozen=True, slots=True)
class _Trailer:
    """Where the ``__index__`` member lies: its header at ``start``, its payload ends at ``end``."""

    count: int  # members it lists
    key_bytes: int
    ext_bytes: int
    start: int
    end: int


def _find_trailer(tail: np.ndarray, *, at: int) -> _Trailer | None:
    """The index trailer in ``tail``, the archive's bytes from offset ``at`` to its end (at least its last
    ``INDEX_TAIL_BYTES``); None when the archive has no index."""
    length = at + len(tail)
    if length < 2 * BLOCK or length % BLOCK:
        return None
    skip = max(0, length - INDEX_TAIL_BYTES - at)
    nonzero = np.flatnonzero(tail[skip:])
    if not len(nonzero):
        return None
    end = skip + int(nonzero[-1]) + 1  # in ``tail``: the payload ends with the magic, followed only by zeros
    trailer = end - len(_INDEX_MAGIC) - _INDEX_TRAILER.size
    if trailer < 0 or at + trailer < BLOCK or tail[end - len(_INDEX_MAGIC) : end].tobytes() != _INDEX_MAGIC:
        return None
    count, key_bytes, ext_bytes, header_block = _INDEX_TRAILER.unpack(tail[trailer : end - len(_INDEX_MAGIC)].tobytes())
    payload = 10 * count + key_bytes + ext_bytes + _INDEX_TRAILER.size + len(_INDEX_MAGIC)
    start = header_block * BLOCK
    if start + BLOCK + payload != at + end or count > start // BLOCK:
        return None
    return _Trailer(count, key_bytes, ext_bytes, start, at + end)


def _index_header_matches(head: bytes, trailer: _Trailer) -> bool:
    """``head`` (512 bytes) is the header of an ``__index__`` member of the trailer's payload size."""
    if head[:100].rstrip(b"\0") != INDEX_NAME.encode() or head[156] not in _REGULAR:
        return False
    try:
        return _octal(head[124:136], "index") == trailer.end - trailer.start - BLOCK
    except IntegrityError:
        return False  # a damaged size field: the header parse reports it


def embedded_keys(read_range: Callable[[int, int], bytes], size: int) -> list[str] | None:
    """The sample keys of a shard of ``size`` bytes from its ``__index__`` member alone, in shard order; None
    when it has none. ``read_range(start, end)`` returns bytes ``[start, end)`` of the shard: one read of the
    last ``INDEX_TAIL_BYTES``, one more of the index when it starts before them (about 60 bytes per sample).

    The member headers are not read, so this trusts the index: use it on a shard whose sha256 was checked
    against its manifest (the index is covered by it). For a shard held in memory, ``index_tar``."""
    at = max(0, size - INDEX_TAIL_BYTES)
    tail = read_range(at, size)
    if len(tail) != size - at:
        return None
    trailer = _find_trailer(np.frombuffer(tail, dtype=np.uint8), at=at)
    if trailer is None:
        return None
    member = tail[trailer.start - at:] if trailer.start >= at else read_range(trailer.start, at) + tail
    if len(member) < trailer.end - trailer.start or not _index_header_matches(bytes(member[:BLOCK]), trailer):
        return None
    data = np.frombuffer(member, dtype=np.uint8, count=trailer.end - trailer.start - BLOCK, offset=BLOCK)
    count = trailer.count
    new_sample = data[9 * count : 10 * count]
    text = data[10 * count : 10 * count + trailer.key_bytes].tobytes()
    try:
        keys = text.decode("ascii").split("\n") if trailer.key_bytes else []
    except UnicodeDecodeError:
        return None
    if int(np.count_nonzero(new_sample)) != len(keys) or (count and not new_sample[0]):
        return None
    return keys


def _index_embedded(array: np.ndarray) -> ShardIndex | None:
    """The index stored in the shard's ``__index__`` member, or None when it has none (or it does not match
    the member headers, which then get parsed)."""
    found = _find_trailer(array, at=0)
    if found is None:
        return None
    count, key_bytes, ext_bytes, start = found.count, found.key_bytes, found.ext_bytes, found.start
    if not _index_header_matches(array[start : start + BLOCK].tobytes(), found):
        return None
    data = start + BLOCK
    sizes = np.frombuffer(array, dtype="<i8", count=count, offset=data).astype(np.int64)
    ext_codes = array[data + 8 * count : data + 9 * count].astype(np.int64)
    new_sample = array[data + 9 * count : data + 10 * count].astype(bool)
    text = array[data + 10 * count : data + 10 * count + key_bytes + ext_bytes].tobytes()
    try:
        keys = text[:key_bytes].decode("ascii").split("\n") if key_bytes else []
        extensions = tuple(text[key_bytes:].decode("ascii").split("\n")) if ext_bytes else ()
    except UnicodeDecodeError:
        return None
    if (sizes < 0).any():
        return None
    headers = _member_headers(sizes)
    if _members_end(headers, sizes) != start:
        return None  # the members it lists do not fill the archive up to the index
    if count and (not new_sample[0] or int(ext_codes.max()) >= len(extensions)):
        return None
    member_sample = np.cumsum(new_sample) - 1
    if (member_sample[-1] + 1 if count else 0) != len(keys):
        return None
    words = np.frombuffer(array, dtype="<u8", count=start // 8).reshape(-1, BLOCK // 8)  # 64 words per block
    rows = headers // BLOCK
    low, high = words[rows, 15], words[rows, 16]  # bytes 120..135 of every member header: its size field
    plain = ((low & _DIGITS_MASK[0]) == _DIGITS_WANT[0]) & ((high & _DIGITS_MASK[1]) == _DIGITS_WANT[1])
    if not plain.all() or not np.array_equal(_octal_words(low, high), sizes):
        return None
    if not np.isin((words[rows, 19] >> np.uint64(32)) & np.uint64(0xFF), _REGULAR).all():  # byte 156: typeflag
        return None
    return ShardIndex(keys=keys, extensions=extensions, member_sample=member_sample, member_ext=ext_codes,
                      member_offset=headers + BLOCK, member_size=sizes)


def _octal_words(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Value of the 11 octal digits in bytes 4..7 of ``low`` and 0..6 of ``high`` (little-endian words).

    SWAR: each step merges neighbouring lanes (the lower byte is the more significant digit), so a
    word of digits takes three multiply-add-mask steps instead of a loop over digits.
    """
    u = np.uint64
    digits = high & u(0x0007070707070707)  # byte 7 (the field's NUL) counts as a trailing 0 digit
    digits = (digits * u(8) + (digits >> u(8))) & u(0x00FF00FF00FF00FF)
    digits = (digits * u(64) + (digits >> u(16))) & u(0x0000FFFF0000FFFF)
    low7 = ((digits * u(4096) + (digits >> u(32))) & u(0xFFFFFFFF)) >> u(3)
    top = (low >> u(32)) & u(0x07070707)
    top = (top * u(8) + (top >> u(8))) & u(0x00FF00FF)
    top4 = (top * u(64) + (top >> u(16))) & u(0xFFFF)
    return ((top4 << u(21)) | low7).astype(np.int64)


def _distinct(values: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """The distinct ASCII strings of a numpy bytes array and each element's code into them."""
    if values.dtype.itemsize <= 8:  # short extensions: unique over integers, far faster than over strings
        packed = values.astype("S8").view("<u8")
        _, first, codes = np.unique(packed, return_index=True, return_inverse=True)
        distinct = values[first]
    else:
        distinct, codes = np.unique(values, return_inverse=True)
    return tuple(value.decode("ascii") for value in distinct.tolist()), codes.astype(np.int64).ravel()


def _build(keys: list[str], samples: list[int], exts: list[str], offsets: list[int], sizes: list[int]) -> ShardIndex:
    codes: dict[str, int] = {}
    ext_codes = [codes.setdefault(ext, len(codes)) for ext in exts]
    return ShardIndex(keys=keys, extensions=tuple(codes), member_sample=np.asarray(samples, dtype=np.int64),
                      member_ext=np.asarray(ext_codes, dtype=np.int64), member_offset=np.asarray(offsets, dtype=np.int64),
                      member_size=np.asarray(sizes, dtype=np.int64))


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


def _index_general(buf: bytes, where: str) -> ShardIndex:
    """One header at a time: ustar prefix, GNU long names, pax paths, base-256 sizes."""
    end = len(buf)
    keys: list[str] = []
    samples: list[int] = []
    exts: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    current_key: str | None = None
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
            keys.append(key)
            current_key = key
        samples.append(len(keys) - 1)
        exts.append(name[dot + 1 :])
        offsets.append(data)
        sizes.append(size)
    return _build(keys, samples, exts, offsets, sizes)
