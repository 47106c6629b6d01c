import numpy as np
import pyarrow as pa
import pytest

from operators.dedup.shingles import ShingleHasher, reference_shingle_hashes, reference_shingles

TEXTS = [
    "the quick brown fox jumps over the lazy dog again and again",
    "",
    "two words",
    "héllo wörld ünïcode 日本語 text here with more words",
    "a  b\tc\nd e f g",
    None,
    "  leading and trailing  ",
    "v\x0bf\x0cr\rcontrol\x01bytes\x08are\x0e\x1fword bytes, \x7f too; only 9-13 and 32 split",
    "ends-in-a-word",
    "starts-with-a-word right after the previous document",
]


@pytest.mark.parametrize("kind,ngram", [("word", 5), ("word", 1), ("char", 5), ("char", 24)])
def test_vectorized_hashes_equal_the_reference(kind, ngram):
    hashes, offsets = ShingleHasher(kind=kind, ngram=ngram)(pa.array(TEXTS))
    assert hashes.dtype == np.uint64 and len(offsets) == len(TEXTS) + 1
    for i, text in enumerate(TEXTS):
        assert hashes[offsets[i] : offsets[i + 1]].tolist() == reference_shingle_hashes(text or "", kind=kind, ngram=ngram)


def test_shingle_counts_and_short_documents():
    _, offsets = ShingleHasher(ngram=5)(pa.array(TEXTS))
    counts = np.diff(offsets).tolist()
    assert counts[0] == 12 - 5 + 1  # 12 words
    assert counts[1] == 0 and counts[5] == 0  # empty and null: no shingles
    assert counts[2] == 1  # fewer words than n: one shingle of all of them
    assert reference_shingles("two words") == [b"two words"]


def test_order_matters_and_whitespace_does_not():
    hasher = ShingleHasher(ngram=2)
    h, o = hasher(pa.array(["a b", "b a", "a \n\t b"]))
    assert h[0] != h[1] and h[0] == h[2]


def test_many_documents_across_blocks_and_chunks():
    texts = [f"doc {i} " + "word " * (i % 50) for i in range(5000)]
    chunked = pa.chunked_array([pa.array(texts[:2000]), pa.array(texts[2000:])])
    hashes, offsets = ShingleHasher()(chunked)
    for i in (0, 1, 1999, 2000, 3777, 4999):
        assert hashes[offsets[i] : offsets[i + 1]].tolist() == reference_shingle_hashes(texts[i])


def test_sliced_array_uses_its_own_window():
    arr = pa.array(["zero one two three four five", "alpha beta gamma delta epsilon zeta"]).slice(1)
    hashes, offsets = ShingleHasher()(arr)
    assert hashes.tolist() == reference_shingle_hashes("alpha beta gamma delta epsilon zeta")


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        ShingleHasher(kind="sentence")
    with pytest.raises(ValueError, match="ngram"):
        ShingleHasher(ngram=0)
