"""The optional false-positive check: confirm LSH candidates by exact shingle-set Jaccard.

Unverified LSH candidates chain: A~B and B~C by chance put A and C in one cluster, and on
templated text (man pages) whole families collapse into giant clusters (precision 0.09 on
``benchmarks/dedup_e2e.py``). With ``verify: true`` each band bucket is turned into a star
around its smallest member (the *anchor*), every (member, anchor) pair is checked with the
exact Jaccard of the two normalized shingle-hash sets, and components are computed over
the confirmed edges only. Star pairs, not all pairs: a bucket of k documents costs k-1
checks (as in datatrove's per-bucket comparison to the first signature); a member only
similar to a non-anchor member can still join through another band. Measured against
complete ground truth (the corpus of ``benchmarks/dedup_e2e.py``, 5k man pages with planted
copies; document recall): stars give 0.993 at 16 x 6 bands and 0.9945 at 20 x 6, all pairs
of every bucket 1.000 at 20 x 6 but with 7.6x the checks (templated pages share buckets),
and stars plus all pairs in buckets of at most 4 members 0.996 with 1.15x; the recall-oriented
bands (``lsh.recall_bands``) matter far more (0.92 at the balanced 9 x 13), so stars stay.

Each document in a candidate pair is normalized and shingled once (``ShingleSets``: its
distinct shingle hashes, sorted, as one binary value), and pairs compare those sets
(``SetJaccard``), vectorized over a batch of pairs: a large page anchoring many buckets is
not re-shingled per pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.dedup.normalize import Normalization, normalize_texts
from operators.dedup.shingles import ShingleHasher

ANCHOR = "_dedup_anchor"
ANCHOR_TEXT = "_dedup_anchor_text"
JACCARD = "jaccard"
SHINGLE_SET = "_dedup_shingle_set"
ANCHOR_SHINGLE_SET = "_dedup_anchor_shingle_set"


def _unique_per_document(hashes: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(doc, hash)`` with duplicates removed: sort by (doc, hash), keep first of each run."""
    docs = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    order = np.lexsort((hashes, docs))
    docs, hashes = docs[order], hashes[order]
    first = np.ones(len(docs), dtype=bool)
    first[1:] = (docs[1:] != docs[:-1]) | (hashes[1:] != hashes[:-1])
    return docs[first], hashes[first]


def jaccard_pairs(left: np.ndarray, left_offsets: np.ndarray, right: np.ndarray, right_offsets: np.ndarray) -> np.ndarray:
    """Exact Jaccard of shingle-hash sets, pair ``i`` = (left doc i, right doc i); vectorized.

    Both sets are deduplicated, concatenated and sorted by (pair, hash); a hash in both sets
    appears twice in a row, so the intersection is a count of equal neighbours.
    """
    n = len(left_offsets) - 1
    left_docs, left_hashes = _unique_per_document(left, left_offsets)
    right_docs, right_hashes = _unique_per_document(right, right_offsets)
    left_sizes = np.bincount(left_docs, minlength=n)
    right_sizes = np.bincount(right_docs, minlength=n)
    docs = np.concatenate([left_docs, right_docs])
    hashes = np.concatenate([left_hashes, right_hashes])
    order = np.lexsort((hashes, docs))
    docs, hashes = docs[order], hashes[order]
    both = (docs[1:] == docs[:-1]) & (hashes[1:] == hashes[:-1])
    intersection = np.bincount(docs[1:][both], minlength=n)
    union = left_sizes + right_sizes - intersection
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, intersection / np.maximum(union, 1), 1.0)


@dataclass(frozen=True)
class JaccardCheck:
    """Batch of (sample_id, text, anchor, anchor_text) -> confirmed (sample_id, anchor, jaccard)."""

    shingler: ShingleHasher
    normalization: Normalization
    threshold: float

    def __call__(self, table: pa.Table) -> pa.Table:
        out_schema = pa.schema([("sample_id", pa.string()), (ANCHOR, pa.string()), (JACCARD, pa.float64())])
        if not table.num_rows:
            return out_schema.empty_table()
        left, left_offsets = self.shingler(normalize_texts(table.column("text"), self.normalization))
        right, right_offsets = self.shingler(normalize_texts(table.column(ANCHOR_TEXT), self.normalization))
        similarity = jaccard_pairs(left, left_offsets, right, right_offsets)
        confirmed = pa.array(similarity >= self.threshold)
        result = pa.table({
            "sample_id": pc.cast(table.column("sample_id"), pa.string()),
            ANCHOR: pc.cast(table.column(ANCHOR), pa.string()),
            JACCARD: pa.array(similarity, pa.float64()),
        })
        return result.filter(confirmed)


@dataclass(frozen=True)
class ShingleSets:
    """Batch of (sample_id, text) -> (sample_id, shingle set): each document's distinct shingle hashes,
    sorted, packed as the bytes of an int64 array (a binary column joins on every engine; list columns
    do not go through Arrow hash joins as payload)."""

    shingler: ShingleHasher
    normalization: Normalization

    def __call__(self, table: pa.Table) -> pa.Table:
        ids = pc.cast(table.column("sample_id"), pa.string())
        hashes, offsets = self.shingler(normalize_texts(table.column("text"), self.normalization))
        docs, distinct = _unique_per_document(hashes, offsets)
        counts = np.bincount(docs, minlength=table.num_rows)
        byte_offsets = np.concatenate([[0], np.cumsum(counts) * 8]).astype(np.int32)
        data = np.ascontiguousarray(distinct).view(np.int64)
        sets = pa.Array.from_buffers(pa.binary(), table.num_rows, [None, pa.py_buffer(byte_offsets.tobytes()),
                                                                    pa.py_buffer(data.tobytes())])
        return pa.table({"sample_id": ids, SHINGLE_SET: sets})


def _unpack_sets(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary column of packed sets -> (all hashes, per-row offsets into them)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    array = pc.cast(array, pa.binary()) if array.type != pa.binary() else array
    offsets_buffer, data_buffer = array.buffers()[1], array.buffers()[2]
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    hashes = data[offsets[0] : offsets[-1]].copy().view(np.int64)
    return hashes, (offsets - offsets[0]) // 8


def set_jaccard(left: np.ndarray, left_offsets: np.ndarray, right: np.ndarray, right_offsets: np.ndarray) -> np.ndarray:
    """Exact Jaccard of pair ``i`` = (left set i, right set i), both sets already distinct: the union of
    the two sorted by (pair, hash) holds a shared hash twice in a row."""
    n = len(left_offsets) - 1
    left_sizes, right_sizes = np.diff(left_offsets), np.diff(right_offsets)
    docs = np.concatenate([np.repeat(np.arange(n), left_sizes), np.repeat(np.arange(n), right_sizes)])
    hashes = np.concatenate([left, right])
    order = np.lexsort((hashes, docs))
    docs, hashes = docs[order], hashes[order]
    both = (docs[1:] == docs[:-1]) & (hashes[1:] == hashes[:-1])
    intersection = np.bincount(docs[1:][both], minlength=n)
    union = left_sizes + right_sizes - intersection
    return np.where(union > 0, intersection / np.maximum(union, 1), 1.0)


@dataclass(frozen=True)
class SetJaccard:
    """Batch of (sample_id, anchor, shingle set, anchor's shingle set) -> confirmed (sample_id, anchor, jaccard)."""

    threshold: float

    def __call__(self, table: pa.Table) -> pa.Table:
        out_schema = pa.schema([("sample_id", pa.string()), (ANCHOR, pa.string()), (JACCARD, pa.float64())])
        if not table.num_rows:
            return out_schema.empty_table()
        left, left_offsets = _unpack_sets(table.column(SHINGLE_SET))
        right, right_offsets = _unpack_sets(table.column(ANCHOR_SHINGLE_SET))
        left_sizes, right_sizes = np.diff(left_offsets), np.diff(right_offsets)
        # size filter: J(A, B) <= min(|A|, |B|) / max(|A|, |B|), so pairs of very unequal sets (a long page
        # anchoring a bucket of short ones) are rejected without touching their hashes
        possible = np.minimum(left_sizes, right_sizes) >= self.threshold * np.maximum(left_sizes, right_sizes)
        similarity = np.zeros(table.num_rows)
        if possible.any():
            left_kept, right_kept = np.repeat(possible, left_sizes), np.repeat(possible, right_sizes)
            similarity[possible] = set_jaccard(
                left[left_kept], np.concatenate([[0], np.cumsum(left_sizes[possible])]),
                right[right_kept], np.concatenate([[0], np.cumsum(right_sizes[possible])]))
        result = pa.table({
            "sample_id": pc.cast(table.column("sample_id"), pa.string()),
            ANCHOR: pc.cast(table.column(ANCHOR), pa.string()),
            JACCARD: pa.array(similarity, pa.float64()),
        })
        return result.filter(pa.array(similarity >= self.threshold))
