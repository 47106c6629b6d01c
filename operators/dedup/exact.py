"""Exact-duplicate kernel: xxh3-128 of the normalized text, one digest per row.

Normalization runs as whole-column pyarrow kernels; hashing reads each value straight
from the Arrow data buffer (a memoryview slice, no str decode) with one C call per row,
since xxhash has no batched API. Rows with equal digests are exact duplicates after
normalization (2**-128 collision chance).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

from operators.dedup.normalize import DEFAULT_NORMALIZATION, Normalization, normalize_texts
from operators.dedup.shingles import string_buffers


_HEX = np.array([f"{i:02x}" for i in range(256)], dtype="S2")


def content_hashes(
    texts: pa.Array | pa.ChunkedArray, normalization: Normalization = DEFAULT_NORMALIZATION
) -> pa.FixedSizeBinaryArray:
    """``fixed_size_binary(16)`` xxh3-128 digests (big-endian, as ``xxh3_128_digest``); null text hashes as ''."""
    return value_hashes(normalize_texts(texts, normalization))


def value_hashes(values: pa.Array | pa.ChunkedArray) -> pa.FixedSizeBinaryArray:
    """xxh3-128 digests of already normalized strings (``content_hashes`` without the normalization)."""
    data, offsets = string_buffers(values)
    view = np.ascontiguousarray(data).data  # a memoryview: slicing copies nothing
    digest = xxhash.xxh3_128_digest
    bounds = offsets.tolist()
    joined = b"".join([digest(view[s:e]) for s, e in zip(bounds[:-1], bounds[1:])])
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(bounds) - 1, [None, pa.py_buffer(joined)])


def content_hash_hex(texts: pa.Array | pa.ChunkedArray, normalization: Normalization = DEFAULT_NORMALIZATION) -> pa.Array:
    """The same digests as 32-character lowercase hex strings."""
    return hex_digests(content_hashes(texts, normalization))


def hex_digests(digests: pa.FixedSizeBinaryArray) -> pa.Array:
    """16-byte digests as 32-character lowercase hex strings."""
    raw = np.frombuffer(digests.buffers()[1], dtype=np.uint8)[: 16 * len(digests)].reshape(-1, 16)
    hexed = np.ascontiguousarray(_HEX[raw]).view("S32").ravel()  # vectorized hex: one table lookup per byte
    return pa.array(hexed, pa.binary(32)).cast(pa.string())
