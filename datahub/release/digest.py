"""The release content digest: order-independent, multiset-sensitive, incremental.

``sum128``: each ``sample_id`` (a 32-hex xxh3-128 content hash, see ``datahub.sample_id``)
read as a 128-bit integer, all summed modulo 2**128, printed as 32 hex digits. Row order and
file layout do not change it; adding or removing any sample (or one copy of a duplicate) does,
and the digest of a union of disjoint row sets is the sum of their digests. An id that is not
32 hex digits is first hashed with xxh3-128. Vectorized with numpy (four 32-bit limbs).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

DIGEST_SCHEME = "sum128"
_MASK = (1 << 128) - 1

_NIBBLE = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _NIBBLE[_c] = 10 + _i


def _hex_ids_sum(ids: pa.Array) -> tuple[int, pa.Array]:
    """Sum of the 32-hex ids; returns (sum, the ids that were not 32-hex)."""
    ids = ids.cast(pa.string())
    well_formed = pc.fill_null(pc.equal(pc.utf8_length(ids), 32), False)
    good = ids.filter(well_formed)
    total = 0
    if len(good):
        offsets = np.frombuffer(good.buffers()[1], dtype=np.int32)[good.offset : good.offset + len(good) + 1]
        raw = np.frombuffer(good.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]  # 32 bytes per id
        nibbles = _NIBBLE[raw].reshape(-1, 32)
        bad = (nibbles == 255).any(axis=1)
        nibbles = nibbles[~bad].astype(np.uint64)
        # 8 nibbles = one 32-bit limb; limbs summed in uint64 are exact up to 2**32 rows.
        weights = (np.uint64(16) ** np.arange(7, -1, -1, dtype=np.uint64)).astype(np.uint64)
        limbs = (nibbles.reshape(-1, 4, 8) * weights).sum(axis=2, dtype=np.uint64)  # (n, 4) big-endian limbs
        sums = limbs.sum(axis=0, dtype=np.uint64)
        total = sum(int(s) << (32 * (3 - i)) for i, s in enumerate(sums.tolist()))
        if bad.any():
            rest = pa.array(np.frombuffer(raw.tobytes(), dtype="S32")[bad].astype(str).tolist(), pa.string())
            return total, pa.concat_arrays([ids.filter(pc.invert(well_formed)), rest])
    return total, ids.filter(pc.invert(well_formed))


def digest_sum(sample_ids: pa.Array | pa.ChunkedArray) -> int:
    """The digest as an integer (add two of them, mod 2**128, for a disjoint union)."""
    arrays = sample_ids.chunks if isinstance(sample_ids, pa.ChunkedArray) else [sample_ids]
    total = 0
    for array in arrays:
        array = array.drop_null() if array.null_count else array
        part, odd = _hex_ids_sum(array)
        total += part
        for value in odd.to_pylist():
            total += int.from_bytes(xxhash.xxh3_128_digest(value.encode("utf-8")), "big")
    return total & _MASK


def release_digest(sample_ids: pa.Array | pa.ChunkedArray) -> str:
    """``sum128:<32 hex>`` over the sample ids (see the module docstring)."""
    return f"{DIGEST_SCHEME}:{digest_sum(sample_ids):032x}"


def id_keys(sample_ids: pa.Array | pa.ChunkedArray, *, seed: int) -> np.ndarray:
    """A seeded uint64 sort key per id: splitmix64 (Steele et al. 2014) of its first 64 bits xor the seed.

    Deterministic for (id, seed) whatever the row order, so weighted sampling is reproducible.
    """
    array = sample_ids.combine_chunks() if isinstance(sample_ids, pa.ChunkedArray) else sample_ids
    array = array.cast(pa.string())
    prefix = pc.utf8_slice_codeunits(pc.fill_null(array, ""), 0, 16)
    padded = pc.utf8_rpad(prefix, 16, "0")
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32)[padded.offset : padded.offset + len(padded) + 1]
    data = np.frombuffer(padded.buffers()[2], dtype=np.uint8)
    if len(padded) and offsets[-1] - offsets[0] == 16 * len(padded):
        nibbles = _NIBBLE[data[offsets[0] : offsets[-1]]].reshape(-1, 16)
    else:  # multi-byte characters: not a hex id
        nibbles = np.full((len(padded), 16), 255, dtype=np.uint8)
    bad = (nibbles == 255).any(axis=1)
    weights = np.uint64(16) ** np.arange(15, -1, -1, dtype=np.uint64)
    values = (np.where(bad[:, None], 0, nibbles).astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    for i in np.flatnonzero(bad):  # ids that are not hex: hash them (rare)
        values[i] = np.uint64(xxhash.xxh3_64_intdigest((array[int(i)].as_py() or "").encode("utf-8")))
    seed_mix = np.uint64(xxhash.xxh3_64_intdigest(str(seed).encode()))
    with np.errstate(over="ignore"):
        z = values ^ seed_mix
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z
