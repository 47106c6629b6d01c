"""Hash partitioning of Arrow tables by key columns, vectorized (numpy over Arrow buffers).

Engines that shuffle with their own tasks (Ray core) use it to send every row with the same
key to the same partition. The hash need only be deterministic and well spread, not stable
across versions: it never leaves one shuffle.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_CHUNK_ROWS = 65_536
_PRIME = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime; odd, so invertible mod 2**64
_PRIME_INVERSE = np.uint64(pow(0x100000001B3, -1, 2**64))


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: spreads every input bit over the output."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xFF51AFD7ED558CCD)
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xC4CEB9FE1A85EC53)
        return x ^ (x >> np.uint64(33))


_POWERS: list[np.ndarray] = [np.ones(1, np.uint64), np.ones(1, np.uint64)]  # P**i and P**-i, grown on demand


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P**i and P**-i for i in 0..n (mod 2**64), cached per process."""
    if len(_POWERS[0]) <= n:
        size = max(n + 1, 2 * len(_POWERS[0]))
        with np.errstate(over="ignore"):
            forward = np.cumprod(np.full(size, _PRIME, dtype=np.uint64))
            backward = np.cumprod(np.full(size, _PRIME_INVERSE, dtype=np.uint64))
        _POWERS[0] = np.concatenate([[np.uint64(1)], forward[:-1]])
        _POWERS[1] = np.concatenate([[np.uint64(1)], backward[:-1]])
    return _POWERS[0], _POWERS[1]


def _string_hashes(array: pa.Array) -> np.ndarray:
    """Polynomial hash of each string's bytes: one cumulative sum per chunk, no per-row loop."""
    out = np.empty(len(array), dtype=np.uint64)
    offset_type = np.int64 if pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type) else np.int32
    for start in range(0, len(array), _CHUNK_ROWS):
        chunk = array.slice(start, _CHUNK_ROWS)
        buffers = chunk.buffers()
        offsets = np.frombuffer(buffers[1], dtype=offset_type)[chunk.offset : chunk.offset + len(chunk) + 1].astype(np.int64)
        data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
        base = offsets[0]
        data = data[base : offsets[-1]].astype(np.uint64)
        local = offsets - base
        forward, backward = _powers(len(data))
        with np.errstate(over="ignore"):
            prefix = np.concatenate([[np.uint64(0)], np.cumsum(data * forward[: len(data)], dtype=np.uint64)])
            sums = prefix[local[1:]] - prefix[local[:-1]]
            # divide out P**start so equal strings hash equal wherever they sit in the buffer
            hashed = sums * backward[local[:-1]] + (local[1:] - local[:-1]).astype(np.uint64)
        out[start : start + len(chunk)] = hashed
    return out


def _column_hashes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type) or pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        hashed = _string_hashes(array)
    elif pa.types.is_integer(array.type) or pa.types.is_boolean(array.type) or pa.types.is_temporal(array.type):
        hashed = pc.fill_null(pc.cast(array, pa.int64()), 0).to_numpy(zero_copy_only=False).view(np.uint64)
    elif pa.types.is_floating(array.type):
        hashed = pc.fill_null(pc.cast(array, pa.float64()), 0.0).to_numpy(zero_copy_only=False).view(np.uint64)
    else:
        raise TypeError(f"cannot hash-partition a column of type {array.type}")
    if array.null_count:
        hashed = np.where(array.is_null().to_numpy(zero_copy_only=False), np.uint64(0), hashed)
    return _fmix64(hashed)


def partition_ids(table: pa.Table, keys: list[str], partitions: int) -> np.ndarray:
    """The partition (0..partitions-1) of each row, from its key columns."""
    combined = np.zeros(table.num_rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for key in keys:
            combined = _fmix64(combined * np.uint64(31) + _column_hashes(table.column(key)))
    return (combined % np.uint64(partitions)).astype(np.int64)


def split_by_key(table: pa.Table, keys: list[str], partitions: int) -> list[pa.Table]:
    """``partitions`` tables; rows with equal keys land in the same one."""
    if partitions == 1:
        return [table]
    ids = partition_ids(table, keys, partitions)
    order = np.argsort(ids, kind="stable")
    bounds = np.searchsorted(ids[order], np.arange(partitions + 1))
    ordered = table.take(pa.array(order))
    return [ordered.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])) for i in range(partitions)]
