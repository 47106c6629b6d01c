"""Eval-set n-grams: normalize text, hash its word n-grams to 64 bits, look them up in a sorted index.

Normalization (``operators.dedup.normalize``, all steps on): Unicode NFKC, lowercase, punctuation and
symbols to spaces, whitespace runs to one space. So case, spacing and punctuation edits of a planted
benchmark item still match. The n-gram hash is the dedup word-shingle hash (``operators.dedup.shingles``:
one vectorized pass over the batch's UTF-8 buffer, no Python per row or per n-gram).

Default n = 13 words: GPT-3 (Brown et al. 2020, appendix C) and Dolma's decontamination use 13-grams;
datatrove's ``NGramsDecontConfig`` uses 12. A text with fewer than n words has one n-gram of all its words,
so a short eval item matches only a sample whose whole normalized text equals it.

The index holds every eval n-gram once: a sorted ``uint64`` array (8 bytes per n-gram: a 14k-item benchmark
of ~60 words per item is ~0.7M n-grams, ~6 MB; more compact than a Python set and exact, unlike a Bloom filter)
and, aligned with it, the position of the first eval item holding it, so a match names its item.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from operators.dedup.normalize import DEFAULT_NORMALIZATION, normalize_texts
from operators.dedup.shingles import ShingleHasher

DEFAULT_NGRAM = 13


def ngram_hashes(texts: pa.Array | pa.ChunkedArray, hasher: ShingleHasher) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the normalized word n-grams of every text and per-text offsets (``len(texts) + 1``)."""
    return hasher(normalize_texts(texts, DEFAULT_NORMALIZATION))


@dataclass(frozen=True)
class Matches:
    """Per text: how many of its n-grams are in the index, and the index item of its first match (-1: none)."""

    counts: np.ndarray  # int64
    first_item: np.ndarray  # int64


@dataclass
class NgramIndex:
    """Sorted unique n-gram hashes of eval items, each with the first item (position in ``refs``) that has it.

    ``refs[i]`` is item i's reference, ``evalset@version:item_id``. Picklable (ships to Ray/Spark workers).
    """

    ngram: int
    hashes: np.ndarray  # uint64, sorted, unique
    items: np.ndarray  # int32, aligned with hashes
    refs: list[str]
    _hasher: ShingleHasher | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, texts: pa.Array | pa.ChunkedArray, refs: list[str], *, ngram: int = DEFAULT_NGRAM) -> NgramIndex:
        """Index the n-grams of ``texts`` (one per eval item, ``refs`` aligned with them)."""
        if len(texts) != len(refs):
            raise ValueError(f"{len(texts)} texts for {len(refs)} refs")
        hasher = ShingleHasher(kind="word", ngram=ngram)
        hashes, offsets = ngram_hashes(texts, hasher)
        owners = np.repeat(np.arange(len(refs), dtype=np.int32), np.diff(offsets))
        unique, first = np.unique(hashes, return_index=True)  # first occurrence: the earliest item wins
        return cls(ngram, unique, owners[first], list(refs), hasher)

    def __len__(self) -> int:
        return len(self.hashes)

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes + self.items.nbytes)

    def hasher(self) -> ShingleHasher:
        if self._hasher is None:
            self._hasher = ShingleHasher(kind="word", ngram=self.ngram)
        return self._hasher

    def match(self, texts: pa.Array | pa.ChunkedArray) -> Matches:
        """Matched n-gram count and first matched item of every text (vectorized over the whole batch)."""
        n = len(texts)
        if n == 0 or len(self.hashes) == 0:
            return Matches(np.zeros(n, np.int64), np.full(n, -1, np.int64))
        hashes, offsets = ngram_hashes(texts, self.hasher())
        position = np.searchsorted(self.hashes, hashes)
        np.minimum(position, len(self.hashes) - 1, out=position)
        hit = self.hashes[position] == hashes
        cumulative = np.concatenate([[0], np.cumsum(hit, dtype=np.int64)])
        counts = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
        first_item = np.full(n, -1, np.int64)
        hit_at = np.flatnonzero(hit)
        if len(hit_at):
            doc_of_hit = np.searchsorted(offsets, hit_at, side="right") - 1
            docs, first = np.unique(doc_of_hit, return_index=True)
            first_item[docs] = self.items[position[hit_at[first]]]
        return Matches(counts, first_item)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_hasher"] = None  # its power tables are rebuilt lazily on the worker
        return state
