import random

import datasketch
import numpy as np
import pyarrow as pa
import pytest

from operators.dedup.minhash import MinHasher, jaccard_estimate, permutations
from operators.dedup.normalize import normalize_texts
from operators.dedup.shingles import reference_shingle_hash, reference_shingles

DOCS = [
    "The quick brown fox jumps over the lazy dog, again and again and again.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
    "short",
    "héllo wörld, ünïcode text here with more words than five",
]


@pytest.mark.parametrize("scheme,mask,num_perm", [("affine32", 0xFFFFFFFF, 128), ("affine64", (1 << 64) - 1, 128),
                                                   ("affine32", 0xFFFFFFFF, 13), ("affine32", 0xFFFFFFFF, 5)])
def test_signatures_equal_datasketch_with_the_same_hash_and_seed(scheme, mask, num_perm):
    """num_perm 13 and 5: the kernel's groups of 8 permutations end in a partial group, or are one."""
    ours = MinHasher(num_perm=num_perm, seed=7, scheme=scheme).signatures(pa.array(DOCS))
    for text, signature in zip(normalize_texts(pa.array(DOCS)).to_pylist(), ours):
        theirs = datasketch.MinHash(num_perm=num_perm, seed=7, scheme=scheme,
                                    hashfunc=lambda s: reference_shingle_hash(s) & mask)
        theirs.update_batch(reference_shingles(text))
        assert theirs.hashvalues.dtype == signature.dtype
        np.testing.assert_array_equal(theirs.hashvalues, signature)


def test_permutations_are_datasketchs():
    a, b = permutations(64, 3, "affine32")
    reference = datasketch.MinHash(num_perm=64, seed=3, scheme="affine32").permutations
    np.testing.assert_array_equal(a, reference[0])
    np.testing.assert_array_equal(b, reference[1])


def test_empty_documents_and_determinism():
    texts = pa.array(["", None, "some words in a document here"])
    first = MinHasher().signatures(texts)
    assert (first[:2] == np.iinfo(np.uint32).max).all()
    np.testing.assert_array_equal(first, MinHasher().signatures(texts))
    assert not np.array_equal(first[2], MinHasher(seed=2).signatures(texts)[2])


def test_jaccard_estimate_within_minhash_error(corpus):
    rng = random.Random(1)
    num_perm = 128
    hasher = MinHasher(num_perm=num_perm, normalization=MinHasher().normalization)
    base = corpus(300, seed=3, words=200)
    variants = []
    for text in base:
        words = text.split()
        keep = rng.uniform(0.3, 1.0)  # a spread of true similarities
        variants.append(" ".join(w if rng.random() < keep else f"z{i}" for i, w in enumerate(words)))
    sig_a = hasher.signatures(pa.array(base))
    sig_b = hasher.signatures(pa.array(variants))
    estimated = jaccard_estimate(sig_a, sig_b)
    h_a, o_a = hasher.shingler(normalize_texts(pa.array(base)))
    h_b, o_b = hasher.shingler(normalize_texts(pa.array(variants)))
    exact = []
    for i in range(len(base)):
        sa, sb = set(h_a[o_a[i] : o_a[i + 1]].tolist()), set(h_b[o_b[i] : o_b[i + 1]].tolist())
        exact.append(len(sa & sb) / len(sa | sb))
    error = np.abs(estimated - np.array(exact))
    assert np.ptp(exact) > 0.3
    assert error.max() <= 3 / np.sqrt(num_perm)
    # Std error is sqrt(J(1-J)/k) <= 0.044 at k = 128; mean |error| ~ 0.8 of that.
    assert error.mean() <= 0.035


@pytest.mark.parametrize("scheme", ["affine32", "affine64"])
@pytest.mark.parametrize("ngram,num_perm", [(5, 128), (1, 13), (3, 5), (9, 64)])
def test_compiled_signatures_equal_the_numpy_path(monkeypatch, scheme, ngram, num_perm):
    """The C kernel (operators/dedup/accel.py) against the numpy reference, bit for bit, on documents
    with every kind of token boundary: none, fewer tokens than n, control bytes, Unicode, long runs."""
    from operators.dedup import accel

    assert accel.enabled(), "the C extension is built by `pip install -e .`: the compiled path must be on in tests"
    rng = random.Random(ngram * 1000 + num_perm)
    words = ["a", "bb", "héllo", "日本語", "x\x01y", "end.", "\x7f", "w" * 40]
    docs = ["", " ", "\t\n", "one", "two words", "v\x0bf\x0cr\rsplit \x1fjoined"] + [
        "".join(rng.choice(words) + rng.choice([" ", "  ", "\n", "\t", "\r\n"]) for _ in range(rng.randint(0, 60)))
        for _ in range(80)
    ]
    hasher = MinHasher(num_perm=num_perm, seed=11, scheme=scheme, ngram=ngram)
    compiled = hasher.signatures(pa.array(docs))
    monkeypatch.setenv("DATAHUB_MINHASH_COMPILED", "0")
    assert not accel.enabled()
    reference = hasher.signatures(pa.array(docs))
    assert compiled.dtype == reference.dtype and compiled.shape == (len(docs), num_perm)
    np.testing.assert_array_equal(compiled, reference)


def test_without_the_compiled_kernel_signatures_take_the_numpy_path(monkeypatch, caplog):
    """An install without a C compiler has no extension: one warning saying how to fix it, same signatures."""
    from operators.dedup import accel

    docs = pa.array(["the quick brown fox jumps over the lazy dog", "", "a b"])
    hasher = MinHasher(num_perm=16, seed=3, ngram=2)
    compiled = hasher.signatures(docs)
    monkeypatch.setattr(accel, "_MODULE", "operators.dedup._not_built")
    monkeypatch.setattr(accel, "_kernel", None)
    monkeypatch.setattr(accel, "_missing", False)
    with caplog.at_level("WARNING", logger="datahub.dedup"):
        assert not accel.enabled()
        np.testing.assert_array_equal(hasher.signatures(docs), compiled)
    warnings = [r.getMessage() for r in caplog.records if "not built" in r.getMessage()]
    assert len(warnings) == 1 and "pip install -e ." in warnings[0]


def test_compiled_kernel_refuses_buffers_that_do_not_fit():
    """The C kernel checks the buffers it is handed: a short output or offsets past the text raise, not write
    out of bounds."""
    from operators.dedup import accel

    kernel = accel._load()
    assert kernel is not None
    data = np.frombuffer(b"one two three", dtype=np.uint8)
    consts = np.ones(5, np.uint64)
    a = b = np.ones(8, np.uint32)
    with pytest.raises(ValueError, match="wrong item size or length"):
        kernel.signatures(data, np.array([0, 13], np.int64), consts, a, b, np.empty((1, 7), np.uint32), 4)
    with pytest.raises(ValueError, match="past the data"):
        kernel.signatures(data, np.array([0, 14], np.int64), consts, a, b, np.empty((1, 8), np.uint32), 4)
    out = np.empty((1, 8), np.uint32)
    kernel.signatures(data, np.array([0, 13], np.int64), consts, a, b, out, 4)
    assert len(set(out[0].tolist())) == 1  # a = b = 1 for every permutation: the same minimum
