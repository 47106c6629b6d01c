"""The numba kernels behind ``operators.dedup.accel`` (imported only when signatures are computed)."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

_njit = numba.njit(cache=True, nogil=True, boundscheck=False)
_inline = numba.njit(inline="always", cache=True)


@_inline
def _fmix64(h: Any) -> Any:  # MurmurHash3 fmix64, wrapping uint64
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@_inline
def _premix32(h: Any) -> Any:  # low 32 bits, then MurmurHash3 fmix32
    mask = np.uint64(0xFFFFFFFF)
    h &= mask
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & mask
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & mask
    h ^= h >> np.uint64(16)
    return h


@_inline
def _is_space(c: Any) -> bool:  # ASCII whitespace: space and bytes 9..13
    return c == 32 or (c >= 9 and c <= 13)


@_inline
def _shingle(window: Any, count: int, consts: Any) -> Any:
    combined = np.uint64(0)
    for k in range(count):
        combined += window[k] * consts[k]
    return _fmix64(combined)


@_njit
def _token_windows(data: Any, start: int, end: int, consts: Any, window: Any, shingles: Any) -> int:
    """Hash one document's word shingles into ``shingles``; returns how many."""
    n = consts.shape[0]
    count = 0
    made = 0
    i = start
    while i < end:
        if _is_space(data[i]):
            i += 1
            continue
        h = np.uint64(0)
        power = np.uint64(1)
        while i < end and not _is_space(data[i]):
            h += (np.uint64(data[i]) + np.uint64(1)) * power
            power *= np.uint64(0x100000001B3)  # TOKEN_BASE in shingles.py
            i += 1
        token = _fmix64(h)
        if count < n:
            window[count] = token
        else:
            for k in range(n - 1):
                window[k] = window[k + 1]
            window[n - 1] = token
        count += 1
        if count >= n:
            shingles[made] = _shingle(window, n, consts)
            made += 1
    if 0 < count < n:  # fewer tokens than n: one shingle of all of them
        shingles[made] = _shingle(window, count, consts)
        made += 1
    return made


@_njit
def _most_shingles(offsets: Any) -> int:
    """An upper bound on any document's shingle count: one per token, a token per two bytes (plus one)."""
    longest = 0
    for d in range(offsets.shape[0] - 1):
        longest = max(longest, offsets[d + 1] - offsets[d])
    return longest // 2 + 2


@_njit
def _kernel32(data: Any, offsets: Any, consts: Any, a: Any, b: Any, out: Any) -> None:
    window = np.zeros(consts.shape[0], np.uint64)
    shingles = np.empty(_most_shingles(offsets), np.uint64)
    mixed = np.empty(shingles.shape[0], np.uint32)
    perms = a.shape[0]
    for d in range(offsets.shape[0] - 1):
        made = _token_windows(data, offsets[d], offsets[d + 1], consts, window, shingles)
        for j in range(made):
            mixed[j] = np.uint32(_premix32(shingles[j]))
        for k in range(perms):  # 32-bit lanes: wrapping multiply-add mod 2**32, then the minimum
            ak, bk = a[k], b[k]  # uint32
            low = np.uint32(0xFFFFFFFF)
            for j in range(made):
                low = min(low, np.uint32(ak * mixed[j] + bk))
            out[d, k] = low


@_njit
def _kernel64(data: Any, offsets: Any, consts: Any, a: Any, b: Any, out: Any) -> None:
    window = np.zeros(consts.shape[0], np.uint64)
    shingles = np.empty(_most_shingles(offsets), np.uint64)
    perms = a.shape[0]
    for d in range(offsets.shape[0] - 1):
        made = _token_windows(data, offsets[d], offsets[d + 1], consts, window, shingles)
        for j in range(made):
            shingles[j] = _fmix64(shingles[j])
        for k in range(perms):
            ak, bk = a[k], b[k]
            low = np.uint64(0xFFFFFFFFFFFFFFFF)
            for j in range(made):
                low = min(low, ak * shingles[j] + bk)
            out[d, k] = low
