"""Vectorized text statistics shared by the quality operators (pyarrow.compute + numpy).

Documents are split once into a flat array of parts (words, lines, paragraphs) plus the index
of the document each part came from; per-document aggregates are ``np.bincount`` over that
index. No Python loop runs per document or per word.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Punctuation/symbol characters a "symbol word" consists of only (datatrove utils.text.PUNCTUATION, abridged).
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~—–“”‘’«»„…•·►、。，；：？！（）《》【】「」"


@dataclass(frozen=True)
class Parts:
    """Parts of every document: ``values[i]`` belongs to document ``parents[i]``."""

    values: pa.Array  # string
    parents: np.ndarray  # int64, one per value
    num_docs: int

    def per_doc(self, weights: np.ndarray | None = None) -> np.ndarray:
        """Sum of ``weights`` (or the count of parts) per document, as float64."""
        return np.bincount(self.parents, weights=weights, minlength=self.num_docs).astype(np.float64)

    def lengths(self) -> np.ndarray:
        return np.asarray(pc.utf8_length(self.values).to_numpy(zero_copy_only=False), dtype=np.int64)

    def select(self, mask: np.ndarray) -> Parts:
        return Parts(self.values.filter(pa.array(mask)), self.parents[mask], self.num_docs)


def _text(text: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    return pc.fill_null(arr, "")


def _from_lists(lists: pa.Array, num_docs: int) -> Parts:
    values = pc.list_flatten(lists)
    parents = np.asarray(pc.list_parent_indices(lists).to_numpy(zero_copy_only=False), dtype=np.int64)
    return Parts(values, parents, num_docs)


def words(text: pa.Array | pa.ChunkedArray) -> Parts:
    """Whitespace-separated tokens."""
    arr = _text(text)
    return _from_lists(pc.utf8_split_whitespace(arr), len(arr))


def split(text: pa.Array | pa.ChunkedArray, pattern: str, *, regex: bool = False) -> Parts:
    """Parts between separators (``\\n`` for lines, ``\\n{2,}`` as a regex for paragraphs)."""
    arr = _text(text)
    lists = pc.split_pattern_regex(arr, pattern=pattern) if regex else pc.split_pattern(arr, pattern=pattern)
    return _from_lists(lists, len(arr))


def ids(values: pa.Array) -> np.ndarray:
    """A dense integer id per distinct value (equal strings, equal ids) across the batch."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    encoded = pc.dictionary_encode(values)
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def repeated_mask(parents: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """True for each element whose key appeared earlier in the same document."""
    if len(keys) == 0:
        return np.zeros(0, dtype=bool)
    order = np.lexsort((np.arange(len(keys)), keys, parents))  # stable: first occurrence first
    sorted_parents, sorted_keys = parents[order], keys[order]
    same = np.zeros(len(keys), dtype=bool)
    same[1:] = (sorted_parents[1:] == sorted_parents[:-1]) & (sorted_keys[1:] == sorted_keys[:-1])
    out = np.zeros(len(keys), dtype=bool)
    out[order] = same
    return out


def duplicate_stats(parts: Parts) -> tuple[np.ndarray, np.ndarray]:
    """Per document: (number of repeated parts, characters in repeated parts).

    Same counting as the Gopher repetition rules (and datatrove's ``find_duplicates``):
    the first occurrence of a part is unique, every later one is a duplicate.
    """
    repeated = repeated_mask(parts.parents, ids(parts.values))
    lengths = parts.lengths()
    return parts.per_doc(repeated.astype(np.float64)), parts.per_doc(np.where(repeated, lengths, 0).astype(np.float64))


_MIX = np.uint64(0x9E3779B97F4A7C15)


def ngram_keys(word_ids: np.ndarray, parents: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """64-bit keys of every word n-gram that lies inside one document, and their start positions."""
    count = len(word_ids) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    starts = np.arange(count, dtype=np.int64)
    inside = parents[starts] == parents[starts + n - 1]
    wid = word_ids.astype(np.uint64) + np.uint64(1)
    key = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):  # n is small (2..10); each step is one vector op over all n-grams
            key = key * _MIX + wid[k : k + count]
            key ^= key >> np.uint64(29)
    return key[inside], starts[inside]


def top_ngram_chars(word_ids: np.ndarray, word_lengths: np.ndarray, parents: np.ndarray, n: int, num_docs: int) -> np.ndarray:
    """Per document: characters covered by the most frequent n-gram (its length x its count),
    as in datatrove's ``find_top_duplicate``."""
    keys, starts = ngram_keys(word_ids, parents, n)
    out = np.zeros(num_docs, dtype=np.float64)
    if len(keys) == 0:
        return out
    docs = parents[starts]
    cum = np.concatenate([[0], np.cumsum(word_lengths)])
    chars = (cum[starts + n] - cum[starts]) + (n - 1)  # words joined by single spaces
    order = np.lexsort((keys, docs))
    d, k, c = docs[order], keys[order], chars[order]
    boundary = np.ones(len(d), dtype=bool)
    boundary[1:] = (d[1:] != d[:-1]) | (k[1:] != k[:-1])
    group = np.cumsum(boundary) - 1
    counts = np.bincount(group)
    first = np.flatnonzero(boundary)
    group_docs = d[first]
    best = np.zeros(num_docs, dtype=np.int64)
    np.maximum.at(best, group_docs, counts)  # the most frequent n-gram (ties: the longer one)
    top = counts == best[group_docs]
    np.maximum.at(out, group_docs[top], (counts * c[first])[top])
    return out


def duplicate_ngram_chars(word_ids: np.ndarray, word_lengths: np.ndarray, parents: np.ndarray, n: int, num_docs: int) -> np.ndarray:
    """Per document: characters of words covered by any repeated n-gram, each word counted once.

    This is the Gopher definition (Rae et al. 2021, appendix A: "fraction of characters
    contained within all duplicate n-grams", overlapping occurrences counted once).
    """
    keys, starts = ngram_keys(word_ids, parents, n)
    out = np.zeros(num_docs, dtype=np.float64)
    if len(keys) == 0:
        return out
    repeated = repeated_mask(parents[starts], keys.view(np.int64))
    cover = np.zeros(len(word_ids) + 1, dtype=np.int64)
    np.add.at(cover, starts[repeated], 1)
    np.add.at(cover, starts[repeated] + n, -1)
    covered = np.cumsum(cover[:-1]) > 0
    return np.bincount(parents, weights=np.where(covered, word_lengths, 0), minlength=num_docs).astype(np.float64)


def ratio(numerator: np.ndarray, denominator: np.ndarray, *, empty: float = 0.0) -> np.ndarray:
    """Elementwise numerator / denominator with ``empty`` where the denominator is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), empty)


def to_numpy(values: pa.Array | pa.ChunkedArray, dtype: type = np.float64) -> np.ndarray:
    return np.asarray(pc.fill_null(values, 0).to_numpy(zero_copy_only=False), dtype=dtype)


def rebuild(parts: Parts, keep: np.ndarray, separator: str) -> pa.Array:
    """Join the kept parts of each document back into one string per document."""
    kept = parts.values.filter(pa.array(keep))
    counts = np.bincount(parts.parents[keep], minlength=parts.num_docs)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), kept)
    return pc.binary_join(lists, separator)
