"""MinHash signatures for a whole Arrow batch, in numpy: no Python loop per shingle.

Permutation family: datasketch 2.0's "affine" schemes (``datasketch/minhash.py``,
https://github.com/ekzhu/datasketch/issues/212): a shingle hash ``h`` is pre-mixed once
with MurmurHash3's finalizer ``fmix`` and permutation ``k`` maps it to
``a_k * fmix(h) + b_k  mod 2**w`` with ``a_k`` odd, a bijection on ``[0, 2**w)`` computed
with native wrapping multiply-add (no modulo, so about 3x faster than datatrove's
``(a*h + b) mod (2**61 - 1)``, and collision-free). ``a_k, b_k`` are drawn exactly as
datasketch draws them from ``np.random.RandomState(seed)``, so ``datasketch.MinHash(
num_perm, seed, scheme=..., hashfunc=<our shingle hash>)`` gives bit-identical signatures.

- ``affine32`` (default, datasketch's default): ``w = 32``, the low 32 bits of the 64-bit
  shingle hash are permuted; uint32 signatures. Twice the SIMD lanes of 64-bit, and 32 bits
  are ample for documents (datasketch advises 64 only for sets of ~1e8 elements).
- ``affine64``: ``w = 64`` over the full shingle hash; uint64 signatures.

An empty document's signature is all ``2**w - 1`` (datasketch's empty value).
The kernel works on blocks of documents whose shingles fit in L2 cache and loops over
groups of 8 permutations inside a block: one broadcast multiply-add for the group, then
``np.minimum.reduceat`` along each row at document offsets.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa

from operators.dedup import accel
from operators.dedup.normalize import DEFAULT_NORMALIZATION, Normalization, normalize_texts
from operators.dedup.shingles import BLOCK_TEXT_BYTES, ShingleHasher, ShingleKind, document_blocks, string_buffers

Scheme = Literal["affine32", "affine64"]
_FMIX32 = (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16)  # MurmurHash3 fmix32
_FMIX64 = (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33)
# Shingles per cache block: ~512 KiB of hashes, measured best on a 2 MiB-L2 core.
_BLOCK_BYTES = 1 << 19
_PERM_GROUP = 8  # permutations per ufunc call: 8 x a block's shingles still fit in L2


def permutations(num_perm: int, seed: int, scheme: Scheme) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` exactly as datasketch 2.0 ``MinHash._init_permutations`` draws them."""
    width, dtype = _scheme_width_dtype(scheme)
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << (width - 1), num_perm, dtype=dtype) * dtype(2) + dtype(1)
    b = gen.randint(0, 1 << width, num_perm, dtype=dtype)
    return a, b


def _scheme_width_dtype(scheme: str) -> tuple[int, type[np.unsignedinteger]]:
    if scheme == "affine32":
        return 32, np.uint32
    if scheme == "affine64":
        return 64, np.uint64
    raise ValueError(f"MinHash scheme must be 'affine32' or 'affine64', got {scheme!r}")


def premix(hashes: np.ndarray, scheme: Scheme) -> np.ndarray:
    """The scheme's input stage: truncate to the width, then MurmurHash3 ``fmix`` (as datasketch)."""
    width, dtype = _scheme_width_dtype(scheme)
    s1, m1, s2, m2, s3 = _FMIX32 if width == 32 else _FMIX64
    h = hashes.astype(dtype)  # truncation to the low 32 bits for affine32
    h ^= h >> dtype(s1)
    h *= dtype(m1)
    h ^= h >> dtype(s2)
    h *= dtype(m2)
    h ^= h >> dtype(s3)
    return h


class MinHasher:
    """Normalize, shingle and MinHash text columns; deterministic for a given configuration."""

    def __init__(
        self,
        *,
        num_perm: int = 128,
        seed: int = 1,
        scheme: Scheme = "affine32",
        shingle: ShingleKind = "word",
        ngram: int = 5,
        normalization: Normalization = DEFAULT_NORMALIZATION,
    ) -> None:
        if num_perm < 1:
            raise ValueError(f"num_perm must be >= 1, got {num_perm}")
        self.num_perm = num_perm
        self.seed = seed
        self.scheme: Scheme = scheme
        self.normalization = normalization
        self.shingler = ShingleHasher(kind=shingle, ngram=ngram)
        self.a, self.b = permutations(num_perm, seed, scheme)
        self.dtype = self.a.dtype
        self.empty_value = np.iinfo(self.dtype).max

    def signatures(self, texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """``(len(texts), num_perm)`` signatures of raw texts (normalized, then shingled)."""
        data, offsets = string_buffers(normalize_texts(texts, self.normalization))
        if self.shingler.kind == "word" and accel.enabled():  # the same signatures, compiled (see accel.py)
            compiled = accel.word_signatures(data, offsets, self.shingler.position_constants, self.a, self.b,
                                             _scheme_width_dtype(self.scheme)[0])
            if compiled is not None:
                return compiled
        out = np.empty((len(offsets) - 1, self.num_perm), dtype=self.dtype)
        # Shingle and permute block by block so the shingle hashes never leave the cache.
        for lo, hi in document_blocks(offsets, BLOCK_TEXT_BYTES):
            begin = offsets[lo]
            hashes, local = self.shingler.hash_buffer(data[begin : offsets[hi]], offsets[lo : hi + 1] - begin)
            out[lo:hi] = self.signatures_from_hashes(hashes, local)
        return out

    def signatures_from_hashes(self, hashes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Signatures from flat 64-bit shingle hashes and per-document offsets (``n_docs + 1``)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        n_docs = len(offsets) - 1
        out = np.full((n_docs, self.num_perm), self.empty_value, dtype=self.dtype)
        nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
        if len(nonempty) == 0:
            return out
        mixed = premix(np.asarray(hashes, dtype=np.uint64), self.scheme)
        starts = offsets[nonempty]
        block = max(1, _BLOCK_BYTES // mixed.itemsize)
        # Block boundaries (indices into `nonempty`): each block starts where the shingle
        # count first exceeds the next multiple of `block`, so blocks are document-aligned.
        cuts = np.unique(np.searchsorted(starts, np.arange(0, int(offsets[-1]), block), side="left"))
        cuts = np.append(cuts[cuts < len(starts)], len(starts))
        result = np.empty((self.num_perm, len(nonempty)), dtype=self.dtype)
        group = min(_PERM_GROUP, self.num_perm)
        a, b = self.a[:, None], self.b[:, None]
        scratch = np.empty(group * min(len(mixed), 4 * block), dtype=self.dtype)
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            begin = starts[lo]
            end = offsets[nonempty[hi - 1] + 1]
            chunk = mixed[None, begin:end]
            local = starts[lo:hi] - begin
            if len(scratch) < group * chunk.shape[1]:
                scratch = np.empty(group * chunk.shape[1], dtype=self.dtype)
            for k in range(0, self.num_perm, group):  # a few permutations per ufunc call: fewer calls, same cache
                size = min(group, self.num_perm - k)
                tmp = scratch[: size * chunk.shape[1]].reshape(size, chunk.shape[1])
                np.multiply(chunk, a[k : k + size], out=tmp)
                tmp += b[k : k + size]
                np.minimum.reduceat(tmp, local, axis=1, out=result[k : k + size, lo:hi])
        out[nonempty] = result.T
        return out


def jaccard_estimate(signature_a: np.ndarray, signature_b: np.ndarray) -> np.ndarray:
    """Fraction of equal signature entries (row-wise for 2-D inputs)."""
    return np.mean(np.asarray(signature_a) == np.asarray(signature_b), axis=-1)
