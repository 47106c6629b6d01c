r"""Eval-set n-grams: normalize text, hash its word n-grams to 64 bits, look them up in a sorted index.

Normalization: Unicode NFKC, lowercase, punctuation and symbols to spaces (the steps of
``operators.dedup.normalize``, datatrove's ``simplify_text``); words are runs of non-whitespace. So case,
spacing and punctuation edits of a planted benchmark item still match. A pure-ASCII text (most of a
corpus) takes a fast path: one 256-entry byte table over the batch's UTF-8 buffer (A-Z to a-z, ASCII
punctuation and symbols to a space), which is what the Unicode steps do to ASCII; other texts go through
pyarrow's NFKC, lowercase and an RE2 ``[\p{P}\p{S}]`` replacement. The n-gram hash is the dedup
word hash (``operators.dedup.shingles``) of each distinct word, combined per window by a prefix sum
(``NgramHasher``): Arrow kernels and numpy passes over the whole batch, no Python per row or per n-gram.

Default n = 13 words: GPT-3 (Brown et al. 2020, appendix C) and Dolma's decontamination use 13-grams;
datatrove's ``NGramsDecontConfig`` uses 12. A text with fewer than n words has one n-gram of all its words,
so a short eval item matches only a sample whose whole normalized text equals it.

The index holds every eval n-gram once: a sorted ``uint64`` array (8 bytes per n-gram: a 14k-item benchmark
of ~60 words per item is ~0.7M n-grams, ~6 MB; exact, unlike a Bloom filter alone) and, aligned with it, the
position of the first eval item holding it, so a match names its item. In front of it sits a one-hash Bloom
filter of 32 bits per n-gram (4 bytes; ~3% of absent n-grams pass): almost every sample n-gram is rejected by
one cache-friendly bit test, and only the rest are binary-searched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

import pyarrow.compute as pc

from operators.dedup.shingles import ShingleHasher, reference_shingle_hash, string_buffers

DEFAULT_NGRAM = 13
# The version of what decides a match: ``normalize_for_ngrams``, ``NgramHasher``'s words and hashes, the index's
# lookup, and which texts of a row are matched (``views``). Bump it with any change that can make a text match other
# eval items (or none): a recorded clean eval-set check names it, and a release gate reuses a recorded check only when
# it is the same (``datahub.release.evalset_gate``). Bump ``DecontaminateOp.version`` (op.py) with it: the operator's
# lineage and params hash name that one.
# 2: chat, preference and trajectory rows are matched by their conversation views too (``views.match_rows``; a view
#    of fewer than ``views.MIN_VIEW_WORDS`` words, or in Chinese/Japanese/Thai letters and digits, matches nothing)
MATCHER_VERSION = 2
# Earlier versions that match a table without conversation columns (``views.VIEW_COLUMNS``) exactly as this one does:
# their checks of such a table stand for today's (2 changed only the conversation views). Empty it with any change to
# how a text is matched; tests/operators/decontam/test_matcher_version.py compares their pinned text digests.
SAME_ON_TEXT_TABLES = frozenset({1})
_PUNCTUATION = r"[\p{P}\p{S}]"  # RE2: Unicode punctuation and symbols (as operators.dedup.normalize)
BLOOM_BITS_PER_NGRAM = 32


def _ascii_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint8)
    table[ord("A"):ord("Z") + 1] += 32
    for byte in range(33, 127):
        if not chr(byte).isalnum():  # ASCII punctuation and symbols: what \p{P} and \p{S} match below 0x80
            table[byte] = 32
    return table


_ASCII = _ascii_table().tobytes()  # for bytes.translate (C, several GB/s; a numpy gather is ~3x slower)


def normalize_for_ngrams(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """NFKC, lowercase, punctuation and symbols to spaces; nulls become empty (see the module docstring)."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks else pa.array([], pa.string())
    texts = pc.fill_null(texts, "")
    ascii_rows = np.asarray(pc.string_is_ascii(texts).to_numpy(zero_copy_only=False), dtype=bool)
    if not ascii_rows.all():  # the Unicode steps on the other rows only, put back in place
        rows = np.flatnonzero(~ascii_rows)
        other = pc.utf8_lower(pc.utf8_normalize(texts.take(pa.array(rows)), form="NFKC"))
        other = pc.replace_substring_regex(other, pattern=_PUNCTUATION, replacement=" ")
        order = np.arange(len(texts), dtype=np.int64)
        order[rows] = len(texts) + np.arange(len(rows))
        texts = pa.concat_arrays([texts.cast(pa.large_string()), other.cast(pa.large_string())]).take(pa.array(order))
    data, offsets = string_buffers(texts)
    mapped = data.tobytes().translate(_ASCII)  # bytes >= 0x80 map to themselves: the Unicode path handled them
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(mapped))


class NgramHasher:
    """Word n-gram hashes of many texts at once, from Arrow's C++ kernels and a few numpy passes.

    Words are split by ``ascii_split_whitespace`` and dictionary-encoded, so each distinct word of a batch is
    hashed once (the dedup word hash: ``operators.dedup.shingles`` with n = 1). An n-gram of words
    ``w_0..w_{k-1}`` (k = n, or all the words of a shorter text) hashes to
    ``sum_j h(w_j) * B**j mod 2**64`` with the odd base ``B = 0x9E3779B97F4A7C15`` (the word hashes are fmix64
    outputs, so the sums are uniform without a final mix); over a batch that is one prefix sum of
    ``h(w_i) * B**i``, and the windows of all positions are two contiguous slices of it,
    ``(S[i + n] - S[i]) * B**-i``, of which those inside one text are kept. Picklable.
    """

    BASE = 0x9E3779B97F4A7C15  # odd: invertible mod 2**64

    def __init__(self, ngram: int = DEFAULT_NGRAM) -> None:
        if ngram < 1:
            raise ValueError(f"ngram must be >= 1, got {ngram}")
        self.ngram = ngram
        self._words = ShingleHasher(kind="word", ngram=1)
        self._powers = np.ones(1, np.uint64)
        self._inverse_powers = np.ones(1, np.uint64)

    def _ensure_powers(self, length: int) -> None:
        if len(self._powers) >= length:
            return
        size = max(length, 2 * len(self._powers))
        base = np.full(size, self.BASE, dtype=np.uint64)
        base[0] = 1
        self._powers = np.cumprod(base, dtype=np.uint64)  # wraps mod 2**64 by design
        base[1:] = pow(self.BASE, -1, 1 << 64)
        self._inverse_powers = np.cumprod(base, dtype=np.uint64)

    def __call__(self, texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """Hashes (uint64) of the normalized word n-grams of every text and per-text offsets (``len(texts) + 1``)."""
        hashes, offsets, _ = self.hashes_and_words(texts)
        return hashes, offsets

    def hashes_and_words(self, texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``self(texts)`` and each text's number of normalized words (int64)."""
        words = pc.ascii_split_whitespace(normalize_for_ngrams(texts))  # edge whitespace: empty words, dropped below
        list_offsets = np.frombuffer(words.buffers()[1], dtype=np.int64 if pa.types.is_large_list(words.type)
                                     else np.int32)[words.offset:words.offset + len(words) + 1].astype(np.int64)
        tokens = words.values[list_offsets[0]:list_offsets[-1]] if len(words) else pa.array([], pa.large_string())
        list_offsets -= list_offsets[0]
        encoded = pc.dictionary_encode(tokens)
        vocabulary_hashes, vocabulary_offsets = self._words(encoded.dictionary)
        indices = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        present = vocabulary_offsets[1:] > vocabulary_offsets[:-1]  # the empty word of an empty text has no hash
        word_hashes = np.zeros(len(present), np.uint64)
        word_hashes[present] = vocabulary_hashes
        keep = present[indices]
        if not keep.all():  # drop empty words; recount each text's words
            kept_before = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
            list_offsets = kept_before[list_offsets]
            indices = indices[keep]
        hashes, offsets = self._windows(word_hashes[indices], list_offsets)
        return hashes, offsets, np.diff(list_offsets)

    def _windows(self, word_hashes: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.ngram
        total = len(word_hashes)
        counts = np.diff(offsets)
        windows = np.where(counts >= n, counts - n + 1, (counts > 0).astype(np.int64))
        out_offsets = np.concatenate([[0], np.cumsum(windows)]).astype(np.int64)
        if total == 0:
            return np.empty(0, np.uint64), out_offsets
        self._ensure_powers(total + 1)
        prefix = np.empty(total + 1, np.uint64)
        prefix[0] = 0
        np.cumsum(word_hashes * self._powers[:total], out=prefix[1:])
        full = np.empty(0, np.uint64)
        if total >= n:  # every n-word window of the buffer by contiguous slices; keep those inside one text
            full = prefix[n:] - prefix[: total + 1 - n]
            full *= self._inverse_powers[: total + 1 - n]
            valid = np.ones(total + 1 - n, dtype=bool)
            long = counts >= n
            # a window starting in the last n - 1 words of a text crosses into the next one
            marks = np.zeros(total + 2, np.int64)
            np.add.at(marks, offsets[1:][long] - n + 1, 1)
            np.add.at(marks, offsets[1:][long], -1)
            valid &= np.cumsum(marks[: total + 1 - n]) == 0
            short_texts = (counts > 0) & (counts < n)  # their words start no valid full window either
            if short_texts.any():
                marks[:] = 0
                np.add.at(marks, offsets[:-1][short_texts], 1)
                np.add.at(marks, offsets[1:][short_texts], -1)
                valid &= np.cumsum(marks[: total + 1 - n]) == 0
            full = full[valid]
        short = np.flatnonzero((counts > 0) & (counts < n))
        if not len(short):
            return full, out_offsets
        # texts of fewer than n words: one window of all their words, inserted in text order
        starts, ends = offsets[:-1][short], offsets[1:][short]
        values = (prefix[ends] - prefix[starts]) * self._inverse_powers[starts]
        out = np.empty(int(out_offsets[-1]), np.uint64)
        is_short = np.zeros(len(out), dtype=bool)
        is_short[out_offsets[short]] = True
        out[is_short] = values
        out[~is_short] = full
        return out, out_offsets


def reference_ngram_hashes(text: str, ngram: int = DEFAULT_NGRAM) -> list[int]:
    """Plain-Python ``NgramHasher`` of one text that ``normalize_for_ngrams`` already normalized (the spec)."""
    mask = (1 << 64) - 1
    words = [reference_shingle_hash(w.encode("utf-8")) for w in text.split()]
    if not words:
        return []
    spans = [words] if len(words) < ngram else [words[i:i + ngram] for i in range(len(words) - ngram + 1)]
    out = []
    for span in spans:
        out.append(sum(h * pow(NgramHasher.BASE, j, 1 << 64) for j, h in enumerate(span)) & mask)
    return out


def ngram_hashes(texts: pa.Array | pa.ChunkedArray, hasher: NgramHasher) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the normalized word n-grams of every text and per-text offsets (``len(texts) + 1``)."""
    return hasher(texts)


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
    bloom: np.ndarray = field(default_factory=lambda: np.zeros(1, np.uint8), repr=False)  # packed bits
    _hasher: NgramHasher | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.bloom) * 8 < len(self.hashes) * BLOOM_BITS_PER_NGRAM // 2:
            self.bloom = _bloom(self.hashes)

    @classmethod
    def build(cls, texts: pa.Array | pa.ChunkedArray, refs: list[str], *, ngram: int = DEFAULT_NGRAM) -> NgramIndex:
        """Index the n-grams of ``texts`` (one per eval item, ``refs`` aligned with them)."""
        if len(texts) != len(refs):
            raise ValueError(f"{len(texts)} texts for {len(refs)} refs")
        hasher = NgramHasher(ngram)
        hashes, offsets = ngram_hashes(texts, hasher)
        owners = np.repeat(np.arange(len(refs), dtype=np.int32), np.diff(offsets))
        unique, first = np.unique(hashes, return_index=True)  # first occurrence: the earliest item wins
        return cls(ngram, unique, owners[first], list(refs), _hasher=hasher)

    def __len__(self) -> int:
        return len(self.hashes)

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes + self.items.nbytes + self.bloom.nbytes)

    def hasher(self) -> NgramHasher:
        if self._hasher is None:
            self._hasher = NgramHasher(self.ngram)
        return self._hasher

    def match(self, texts: pa.Array | pa.ChunkedArray, *, min_words: int = 1,
              spare: Callable[[pa.Array], np.ndarray] | None = None) -> Matches:
        """Matched n-gram count and first matched item of every text (vectorized over the whole batch); a text of
        fewer than ``min_words`` normalized words matches nothing (``views.MIN_VIEW_WORDS``) unless ``spare`` (given
        those texts only) says True for it (``views.unspaced_long_enough``)."""
        n = len(texts)
        if n == 0 or len(self.hashes) == 0:
            return Matches(np.zeros(n, np.int64), np.full(n, -1, np.int64))
        hashes, offsets, words = self.hasher().hashes_and_words(texts)
        if min_words > 1:  # the short texts' one window each (all their words) is not looked up
            long_enough = words >= min_words
            short = np.flatnonzero(~long_enough & (words > 0))
            if spare is not None and len(short):
                long_enough[short[spare(texts.take(pa.array(short)))]] = True
            windows = np.where(long_enough, np.diff(offsets), 0)
            hashes = hashes[np.repeat(long_enough, np.diff(offsets))]
            offsets = np.concatenate([[0], np.cumsum(windows)]).astype(np.int64)
        maybe = np.flatnonzero(_bloom_test(self.bloom, hashes))
        candidates = hashes[maybe]
        position = np.searchsorted(self.hashes, candidates)
        np.minimum(position, len(self.hashes) - 1, out=position)
        found = self.hashes[position] == candidates
        hit = np.zeros(len(hashes), dtype=bool)
        hit[maybe[found]] = True
        item_at = np.zeros(len(hashes), dtype=np.int64)
        item_at[maybe[found]] = self.items[position[found]]
        cumulative = np.concatenate([[0], np.cumsum(hit, dtype=np.int64)])
        counts = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
        first_item = np.full(n, -1, np.int64)
        hit_at = np.flatnonzero(hit)
        if len(hit_at):
            doc_of_hit = np.searchsorted(offsets, hit_at, side="right") - 1
            docs, first = np.unique(doc_of_hit, return_index=True)
            first_item[docs] = item_at[hit_at[first]]
        return Matches(counts, first_item)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_hasher"] = None  # its power tables are rebuilt lazily on the worker
        return state


def _bloom_bits(count: int) -> int:
    """log2 of the filter's size in bits: a power of two with at least BLOOM_BITS_PER_NGRAM bits per n-gram."""
    return max(10, int(np.ceil(np.log2(max(count, 1) * BLOOM_BITS_PER_NGRAM))))


BLOOM_CHUNK = 1 << 20  # n-grams set at a time (the shifted copies are 9 bytes each)


def _bloom(hashes: np.ndarray) -> np.ndarray:
    """The packed filter (bit ``i % 8`` of byte ``i // 8`` for slot ``i``, as ``np.packbits(bitorder="little")``),
    set a chunk of n-grams at a time: a bool per slot first held 8 bits for each of an n-gram's 32 (64 MB for a 2M
    n-gram index)."""
    bits = _bloom_bits(len(hashes))
    packed = np.zeros((1 << bits) // 8, dtype=np.uint8)
    shift = np.uint64(64 - bits)  # top bits: the hashes are fmix64 outputs, uniform
    for start in range(0, len(hashes), BLOOM_CHUNK):
        slots = hashes[start:start + BLOOM_CHUNK] >> shift
        np.bitwise_or.at(packed, slots >> np.uint64(3),
                         np.left_shift(np.uint8(1), (slots & np.uint64(7)).astype(np.uint8)))
    return packed


def _bloom_test(bloom: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    bits = int(np.log2(len(bloom) * 8))
    slot = hashes >> np.uint64(64 - bits)
    return ((bloom[slot >> np.uint64(3)] >> (slot & np.uint64(7)).astype(np.uint8)) & 1).astype(bool)
