"""Word and character n-gram shingles, hashed to 64 bits over a whole Arrow batch at once.

The result of shingling a batch is one flat ``uint64`` array of shingle hashes plus
per-document offsets (document ``d`` owns ``hashes[offsets[d]:offsets[d + 1]]``), the
layout the MinHash kernel reduces over with ``np.minimum.reduceat``.

The hash (ours, chosen because it vectorizes over the UTF-8 buffer with no Python loop):

- a byte string ``s`` hashes to ``poly(s) = sum_j (s[j] + 1) * B**j  (mod 2**64)`` with the
  odd base ``B = 0x100000001B3`` (the FNV-1 64-bit prime). Over a buffer this is one
  ``cumsum`` of ``(byte + 1) * B**pos``; any substring is ``(S[end] - S[start]) * B**-start``,
  since an odd ``B`` is invertible mod 2**64.
- ``mix`` is MurmurHash3's 64-bit finalizer ``fmix64`` (the pre-mix datasketch 2.0 also uses).
- word shingle over tokens ``t_0..t_{m-1}``: ``mix(sum_k mix(poly(t_k)) * C_k)`` with fixed odd
  per-position constants ``C_k`` (so order matters); tokens are maximal runs of non-ASCII-
  whitespace bytes (normalize first so Unicode spaces became ASCII ones).
- char shingle: ``mix(poly(utf8 bytes of n consecutive code points))``.

A document with fewer than ``n`` tokens (characters) but at least one gets a single
shingle of all of them, so short documents still dedup (datatrove yields none); an empty
document gets no shingles. ``reference_shingle_hashes`` is the same hash in plain Python,
used by the tests and for parity with ``datasketch.MinHash(hashfunc=...)``.
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ShingleKind = Literal["word", "char"]

_MASK64 = (1 << 64) - 1
TOKEN_BASE = 0x100000001B3  # FNV-1 64-bit prime: odd, so invertible mod 2**64
_TOKEN_BASE_INV = pow(TOKEN_BASE, -1, 1 << 64)
_FMIX_M1 = 0xFF51AFD7ED558CCD  # MurmurHash3 fmix64 constants
_FMIX_M2 = 0xC4CEB9FE1A85EC53
_TOKEN_PATTERN = re.compile(rb"[^\t\n\v\f\r ]+")


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_constants(count: int) -> list[int]:
    """The odd multipliers ``C_k`` that make a word shingle's hash depend on word order."""
    return [_splitmix64(k + 1) | 1 for k in range(count)]


def fmix64(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (a bijection), on a uint64 array; wraps mod 2**64."""
    h = values ^ (values >> np.uint64(33))
    h *= np.uint64(_FMIX_M1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_FMIX_M2)
    h ^= h >> np.uint64(33)
    return h


def _fmix64_int(h: int) -> int:
    h ^= h >> 33
    h = (h * _FMIX_M1) & _MASK64
    h ^= h >> 33
    h = (h * _FMIX_M2) & _MASK64
    return h ^ (h >> 33)


def string_buffers(texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes (uint8, zero-copy) and int64 offsets (rebased to 0) of a string column; null -> ''."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks else pa.array([], pa.string())
    if texts.null_count:
        texts = pc.fill_null(texts, "")
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        texts = texts.cast(pa.large_string())
    offset_type = np.int32 if pa.types.is_string(texts.type) else np.int64
    buffers = texts.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[texts.offset : texts.offset + len(texts) + 1]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None and len(texts) else np.empty(0, np.uint8)
    data = data[offsets[0] : offsets[-1]]
    return data, offsets - offsets[0]


# Text per block: the block's uint64 temporaries (8-16x the text) then stay in L2/L3 cache.
BLOCK_TEXT_BYTES = 1 << 17


def document_blocks(offsets: np.ndarray, target: int) -> list[tuple[int, int]]:
    """Split documents into runs ``[lo, hi)`` of about ``target`` bytes (a long document alone)."""
    n_docs = len(offsets) - 1
    if n_docs == 0:
        return []
    marks = np.arange(0, int(offsets[-1]) + 1, max(1, target))
    cuts = np.unique(np.concatenate([[0], np.searchsorted(offsets[:-1], marks, side="left"), [n_docs]]))
    cuts = cuts[cuts <= n_docs]
    return [(int(lo), int(hi)) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]


class ShingleHasher:
    """Hash the word (or char) n-grams of many documents at once.

    Holds only constant tables (powers of the hash base, grown to the longest buffer seen),
    so one instance can be reused for every batch; it is picklable.
    """

    def __init__(self, *, kind: ShingleKind = "word", ngram: int = 5) -> None:
        if kind not in ("word", "char"):
            raise ValueError(f"shingle kind must be 'word' or 'char', got {kind!r}")
        if ngram < 1:
            raise ValueError(f"ngram must be >= 1, got {ngram}")
        self.kind: ShingleKind = kind
        self.ngram = ngram
        self.position_constants = np.array(position_constants(ngram), dtype=np.uint64)  # C_k (also used by accel.py)
        self._powers = np.ones(1, dtype=np.uint64)
        self._inverse_powers = np.ones(1, dtype=np.uint64)
        self._power_sums = np.zeros(1, dtype=np.uint64)  # [L] = sum_{j<L} B**j: the "+1" of each byte of L bytes

    def _ensure_powers(self, length: int) -> None:
        if len(self._powers) >= length:
            return
        size = max(length, 2 * len(self._powers))
        base = np.full(size, TOKEN_BASE, dtype=np.uint64)
        base[0] = 1
        self._powers = np.cumprod(base, dtype=np.uint64)  # wraps mod 2**64 by design
        self._power_sums = np.concatenate([[np.uint64(0)], np.cumsum(self._powers, dtype=np.uint64)])
        base[1:] = _TOKEN_BASE_INV
        self._inverse_powers = np.cumprod(base, dtype=np.uint64)

    def __call__(self, texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """Shingle hashes (uint64) and per-document offsets (int64, ``len(texts) + 1``)."""
        data, offsets = string_buffers(texts)
        parts, part_offsets = [], [np.zeros(1, np.int64)]
        total = 0
        for lo, hi in document_blocks(offsets, BLOCK_TEXT_BYTES):
            hashes, local = self.hash_buffer(data[offsets[lo] : offsets[hi]], offsets[lo : hi + 1] - offsets[lo])
            parts.append(hashes)
            part_offsets.append(local[1:] + total)
            total += len(hashes)
        if not parts:
            return np.empty(0, np.uint64), np.zeros(len(offsets), np.int64)
        return np.concatenate(parts), np.concatenate(part_offsets)

    def hash_buffer(self, data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like ``__call__`` over a raw UTF-8 buffer and its document offsets."""
        n_docs = len(offsets) - 1
        length = len(data)
        if length == 0:
            return np.empty(0, np.uint64), np.zeros(n_docs + 1, np.int64)
        self._ensure_powers(length + 1)
        prefix = np.empty(length + 1, dtype=np.uint64)
        prefix[0] = 0
        # sum_j s[j] * B**j: one pass (uint8 times uint64); the "+ 1" per byte is added per substring below
        np.cumsum(np.multiply(data, self._powers[:length], dtype=np.uint64), out=prefix[1:])
        doc_starts = offsets[:-1][offsets[:-1] < offsets[1:]]  # non-empty documents only
        if self.kind == "word":
            return self._word_shingles(data, offsets, doc_starts, prefix)
        return self._char_shingles(data, offsets, doc_starts, prefix)

    def _substring_hashes(self, prefix: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        hashes = prefix[ends] - prefix[starts]
        hashes *= self._inverse_powers[starts]
        hashes += self._power_sums[ends - starts]  # sum_j (s[j] + 1) * B**j = sum_j s[j] * B**j + sum_j B**j
        return hashes

    def _word_shingles(
        self, data: np.ndarray, offsets: np.ndarray, doc_starts: np.ndarray, prefix: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        n = self.ngram
        whitespace = data == 32  # space, or \t \n \v \f \r (bytes 9..13): two SIMD compares, no table lookup
        whitespace |= (data - np.uint8(9)) <= 4
        in_token = ~whitespace
        previous = np.empty_like(in_token)
        previous[0] = False
        previous[1:] = in_token[:-1]
        previous[doc_starts] = False
        following = np.empty_like(in_token)
        following[-1] = False
        following[:-1] = in_token[1:]
        following[doc_starts[doc_starts > 0] - 1] = False
        token_starts = np.flatnonzero(in_token & ~previous)
        token_ends = np.flatnonzero(in_token & ~following) + 1
        token_hashes = fmix64(self._substring_hashes(prefix, token_starts, token_ends))
        # Tokens per document: token_starts is sorted, so count by the offsets.
        token_offsets = np.searchsorted(token_starts, offsets, side="left").astype(np.int64)
        return self._combine_windows(token_hashes, token_offsets, n)

    def _combine_windows(self, token_hashes: np.ndarray, token_offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        token_counts, shingle_counts, shingle_offsets, first = _shingle_starts(token_offsets, n)
        total = len(first)
        padded = np.concatenate([token_hashes, np.zeros(n, np.uint64)])
        # Every window of n consecutive tokens, by shifted slices (no gathers), then the shingles' windows.
        count = len(token_hashes)
        windows = padded[:count] * self.position_constants[0]
        for k in range(1, n):
            windows += padded[k : k + count] * self.position_constants[k]
        combined = windows[first] if total else np.empty(0, np.uint64)
        short = np.flatnonzero((token_counts < n) & (token_counts > 0))
        if len(short):  # fewer tokens than n: one shingle of all of them (the slices ran into the next document)
            start, size = token_offsets[short], token_counts[short]
            value = np.zeros(len(short), np.uint64)
            for k in range(n):
                term = padded[np.minimum(start + k, count)] * self.position_constants[k]
                term *= (size > k).astype(np.uint64)
                value += term
            combined[shingle_offsets[short]] = value
        return fmix64(combined), shingle_offsets

    def _char_shingles(
        self, data: np.ndarray, offsets: np.ndarray, doc_starts: np.ndarray, prefix: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        n = self.ngram
        char_starts = np.flatnonzero((data & 0xC0) != 0x80)
        char_offsets = np.searchsorted(char_starts, offsets, side="left").astype(np.int64)
        _, shingle_counts, shingle_offsets, first = _shingle_starts(char_offsets, n)
        # End of a shingle = start of char first+n, or the document's end.
        boundaries = np.concatenate([char_starts, [len(data)]])
        doc_end_char = np.repeat(char_offsets[1:], shingle_counts)
        last = np.minimum(first + n, doc_end_char)
        starts = char_starts[first]
        ends = np.where(last < doc_end_char, boundaries[last], np.repeat(offsets[1:], shingle_counts))
        return fmix64(self._substring_hashes(prefix, starts, ends)), shingle_offsets


def _poly_int(data: bytes) -> int:
    h, power = 0, 1
    for byte in data:
        h = (h + (byte + 1) * power) & _MASK64
        power = (power * TOKEN_BASE) & _MASK64
    return h


def reference_shingles(text: str, *, kind: ShingleKind = "word", ngram: int = 5) -> list[bytes]:
    """The shingles of one text as byte strings (word shingles joined by one space), in order."""
    data = text.encode("utf-8")
    if kind == "word":
        units = _TOKEN_PATTERN.findall(data)
        join = b" "
    else:
        decoded = data.decode("utf-8")
        units = [ch.encode("utf-8") for ch in decoded]
        join = b""
    if not units:
        return []
    if len(units) < ngram:
        return [join.join(units)]
    return [join.join(units[i : i + ngram]) for i in range(len(units) - ngram + 1)]


def reference_shingle_hash(shingle: bytes, *, kind: ShingleKind = "word") -> int:
    """Plain-Python hash of one shingle from :func:`reference_shingles` (the vectorized kernel's spec)."""
    if kind == "char":
        return _fmix64_int(_poly_int(shingle))
    constants = position_constants(len(shingle.split(b" ")))
    combined = 0
    for token, constant in zip(shingle.split(b" "), constants):
        combined = (combined + _fmix64_int(_poly_int(token)) * constant) & _MASK64
    return _fmix64_int(combined)


def reference_shingle_hashes(text: str, *, kind: ShingleKind = "word", ngram: int = 5) -> list[int]:
    return [reference_shingle_hash(s, kind=kind) for s in reference_shingles(text, kind=kind, ngram=ngram)]


def _shingle_starts(unit_offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per document of ``unit_offsets`` (tokens or characters): its unit count, its shingle count (windows of
    ``n`` units; one for a document of fewer), the shingle offsets, and each shingle's first unit (global)."""
    unit_counts = np.diff(unit_offsets)
    shingle_counts = np.where(unit_counts >= n, unit_counts - n + 1, np.minimum(unit_counts, 1))
    shingle_offsets = np.zeros(len(unit_counts) + 1, dtype=np.int64)
    np.cumsum(shingle_counts, out=shingle_offsets[1:])
    first = np.arange(int(shingle_offsets[-1]), dtype=np.int64)
    first += np.repeat(unit_offsets[:-1] - shingle_offsets[:-1], shingle_counts)
    return unit_counts, shingle_counts, shingle_offsets, first
