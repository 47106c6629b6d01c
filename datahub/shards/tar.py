"""Deterministic POSIX ustar writing for WebDataset shards.

Every header is fixed except name and size (mtime 0, uid/gid 0, uname/gname "datahub",
mode 0644), so the same samples in the same order give byte-identical shards. Member names
are validated: a sample can only ever write ``KEY.EXT`` at the top of the archive.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from datahub.errors import IntegrityError

BLOCK = 512
RECORD = 20 * BLOCK  # tar's default record size: GNU tar and tarfile pad the end of an archive to it
_ZERO_BLOCK = bytes(BLOCK)
# The webdataset reader splits key from extension at the first dot of the basename, so keys
# hold no dot; extensions are lowercase words (txt, json, jpg, wav, ...).
_KEY = re.compile(r"^[A-Za-z0-9_-]{1,90}$")
_EXT = re.compile(r"^[a-z0-9][a-z0-9_]{0,8}$")
_UNAME = b"datahub"


def check_key(key: str, *, where: str = "sample") -> str:
    """A sample key: letters, digits, '_' or '-', 1-90 chars (no '/', '.', '..', control characters)."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise IntegrityError(
            f"{where}: sample key {key!r} is not a valid shard key: use 1-90 characters of [A-Za-z0-9_-] "
            "(no '/', '.', or control characters; the webdataset reader splits the key at the first dot)"
        )
    return key


def check_extension(ext: str, *, where: str = "column") -> str:
    if not isinstance(ext, str) or not _EXT.match(ext):
        raise IntegrityError(
            f"{where}: {ext!r} cannot be a member extension: use 1-9 lowercase letters, digits or '_' "
            "(rename the column, e.g. image_jpg -> jpg)"
        )
    return ext


def member_name(key: str, ext: str) -> str:
    return f"{check_key(key)}.{check_extension(ext)}"


def _octal(value: int, width: int) -> bytes:
    return f"{value:0{width - 1}o}".encode() + b"\x00"


def _template() -> bytes:
    block = bytearray(BLOCK)
    block[100:108] = _octal(0o644, 8)
    block[108:116] = _octal(0, 8)  # uid
    block[116:124] = _octal(0, 8)  # gid
    block[136:148] = _octal(0, 12)  # mtime: fixed for byte-identical shards
    block[148:156] = b" " * 8  # the checksum is computed with this field as spaces
    block[156:157] = b"0"
    block[257:263] = b"ustar\x00"
    block[263:265] = b"00"
    block[265 : 265 + len(_UNAME)] = _UNAME
    block[297 : 297 + len(_UNAME)] = _UNAME
    block[329:337] = _octal(0, 8)
    block[337:345] = _octal(0, 8)
    return bytes(block)


_TEMPLATE = _template()
_TEMPLATE_SUM = sum(_TEMPLATE)
_SAFE_NAME = re.compile(r"^[\x20-\x7e]{1,100}$")


def header(name: str, size: int) -> bytes:
    """The 512-byte ustar header of a regular file ``name`` of ``size`` bytes (only name and size vary)."""
    if not _SAFE_NAME.match(name) or "/" in name or ".." in name:
        raise IntegrityError(f"tar member name {name!r} is not allowed (1-100 printable ASCII bytes, no '/' or '..')")
    if size >= 8**11:
        raise IntegrityError(f"tar member {name!r}: {size} bytes does not fit a ustar header (max 8 GiB)")
    raw = name.encode("ascii")
    size_field = _octal(size, 12)
    checksum = _TEMPLATE_SUM + sum(raw) + sum(size_field)
    return b"".join((raw, _TEMPLATE[len(raw):124], size_field, _TEMPLATE[136:148],
                     f"{checksum:06o}".encode(), b"\x00 ", _TEMPLATE[156:]))


def member_bytes(name: str, data: bytes) -> bytes:
    """Header, data and zero padding to the next 512-byte boundary."""
    pad = -len(data) % BLOCK
    return header(name, len(data)) + data + (b"\x00" * pad if pad else b"")


def member_size(data_size: int) -> int:
    """Bytes one member takes in the archive."""
    return BLOCK + data_size + (-data_size % BLOCK)


def end_of_archive(written: int) -> bytes:
    """Two zero blocks, then zero padding to a full record (as GNU tar writes it)."""
    total = written + 2 * BLOCK
    return _ZERO_BLOCK * 2 + bytes(-total % RECORD)


def member_blocks(names: pa.Array, sizes: np.ndarray) -> pa.Array:
    """``header(name, size)`` for many members at once, as a large_binary array of 512-byte values.

    Same bytes as :func:`header` (tests compare them); one numpy pass instead of a Python call per member.
    """
    blocks = header_blocks(names, sizes)
    value_offsets = np.arange(len(blocks) + 1, dtype=np.int64) * BLOCK
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(blocks), [None, pa.py_buffer(value_offsets),
                                                                             pa.py_buffer(blocks.reshape(-1))])


def header_blocks(names: pa.Array, sizes: np.ndarray) -> np.ndarray:
    """``member_blocks`` as a numpy array of members x 512 bytes (uint8), to be copied into a shard by block."""
    import pyarrow.compute as pc

    n = len(names)
    names = pc.cast(names, pa.large_binary())
    names = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
    sizes = np.asarray(sizes, dtype=np.int64)
    offsets = np.frombuffer(names.buffers()[1], dtype=np.int64)[names.offset:names.offset + n + 1] if n else \
        np.zeros(1, dtype=np.int64)
    data = np.frombuffer(names.buffers()[2], dtype=np.uint8) if n and names.buffers()[2] is not None else \
        np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    chars = data[offsets[0]:offsets[-1]]
    # the checks of ``header`` over all names at once (row by row only to find the first bad one): printable ASCII,
    # 1-100 bytes, no '/' and no '..' (a '..' across two names only sends the check row by row)
    suspect = bool(((chars < 0x20) | (chars > 0x7E) | (chars == 0x2F)).any() or (lengths < 1).any()
                   or (lengths > 100).any() or ((chars[1:] == 0x2E) & (chars[:-1] == 0x2E)).any())
    too_big = sizes >= 8**11
    if n and (suspect or too_big.any()):
        text = pc.cast(names, pa.large_string())
        bad = pc.or_(pc.invert(pc.match_substring_regex(text, r"^[\x20-\x7e]{1,100}$")),
                     pc.or_(pc.match_substring(text, "/"), pc.match_substring(text, "..")))
        wrong = np.asarray(pc.fill_null(bad, True)) | too_big
        if wrong.any():
            first = int(np.flatnonzero(wrong)[0])
            header(names[first].as_py().decode("ascii", "replace"), int(sizes[first]))  # raises with the message
    blocks = np.broadcast_to(np.frombuffer(_TEMPLATE, dtype=np.uint8), (n, BLOCK)).copy()
    if n and int(lengths.min()) == int(lengths.max()):  # names of one length (content-hash keys): a matrix copy
        blocks[:, :int(lengths[0])] = chars.reshape(n, int(lengths[0]))
    else:  # each name's bytes at the start of its block: flat positions (row * BLOCK + column)
        starts = np.repeat(np.arange(n) * BLOCK - (offsets[:-1] - offsets[0]), lengths)
        blocks.reshape(-1)[np.arange(len(chars)) + starts] = chars
    digits = ((sizes[:, None] >> (3 * np.arange(10, -1, -1))) & 7) + ord("0")  # 11 octal digits, then NUL
    blocks[:, 124:135] = digits
    blocks[:, 135] = 0
    # the checksum: the template's (its checksum field as spaces, name and size fields zero) plus name and size bytes
    name_sums = np.zeros(n, dtype=np.int64)
    if len(chars):
        name_sums = np.add.reduceat(chars.astype(np.int64), offsets[:-1] - offsets[0]) if n else name_sums
    checksum = _TEMPLATE_SUM + name_sums + digits.sum(axis=1)
    blocks[:, 148:154] = ((checksum[:, None] >> (3 * np.arange(5, -1, -1))) & 7) + ord("0")
    blocks[:, 154], blocks[:, 155] = 0, ord(" ")
    return blocks


def zero_padding(sizes: np.ndarray) -> pa.Array:
    """Per member, the zero bytes that pad ``size`` data bytes to the next 512-byte boundary (large_binary)."""
    pads = -np.asarray(sizes, dtype=np.int64) % BLOCK
    value_offsets = np.concatenate([[0], np.cumsum(pads)]).astype(np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(pads), [None, pa.py_buffer(value_offsets),
                                                                           pa.py_buffer(bytes(int(value_offsets[-1])))])
