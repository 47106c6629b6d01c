"""The eval n-gram index: normalized 13-gram matches survive case, spacing, punctuation and one changed word."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from operators.decontam.ngrams import NgramHasher, NgramIndex, reference_ngram_hashes
from operators.dedup.normalize import normalize_text

ITEM = ("Which planet of the solar system has the longest day, measured as one full rotation relative to the "
        "distant stars, and why does it rotate backwards?\nVenus, probably because of a giant early impact")
OTHER = "Name the element whose symbol is W on the periodic table and give its melting point in kelvin\nTungsten 3695"


@pytest.fixture(scope="module")
def index() -> NgramIndex:
    return NgramIndex.build(pa.array([ITEM, OTHER, "too short"]), ["bench@1:a", "bench@1:b", "bench@1:c"])


def test_verbatim_and_edited_plants_match_their_item(index):
    words = ITEM.split()
    changed = " ".join(words[:10] + ["REPLACED"] + words[11:])
    docs = [
        "Some preface text. " + ITEM + " And an unrelated ending.",  # verbatim inside a document
        ITEM.upper(),  # case
        "\n\n".join("   ".join(line.split()) for line in ITEM.splitlines()),  # whitespace
        ITEM.replace(",", " ;").replace("?", "!"),  # punctuation
        changed,  # one changed word: the 13-grams away from it still match
        "prefix " + OTHER,
    ]
    matches = index.match(pa.array(docs))
    assert (matches.counts > 0).all()
    assert [index.refs[i] for i in matches.first_item] == ["bench@1:a"] * 5 + ["bench@1:b"]
    assert matches.counts[4] < matches.counts[1]  # the changed word removed the 13 windows that cover it


def test_clean_text_and_nulls_do_not_match(index):
    docs = ["The quick brown fox jumps over the lazy dog while the planet keeps rotating on its axis every day.",
            None, "", "Which planet of the solar system"]  # a 6-word prefix is not a 13-gram
    matches = index.match(pa.array(docs, pa.string()))
    assert matches.counts.tolist() == [0, 0, 0, 0]
    assert matches.first_item.tolist() == [-1, -1, -1, -1]


def test_short_item_matches_only_a_whole_equal_text(index):
    matches = index.match(pa.array(["Too   SHORT!", "this is too short to say", "too short"]))
    assert matches.counts.tolist() == [1, 0, 1]
    assert index.refs[matches.first_item[0]] == "bench@1:c"


def test_hashes_are_the_plain_python_spec():
    index = NgramIndex.build(pa.array([ITEM]), ["x@1:0"], ngram=13)
    assert set(index.hashes.tolist()) == set(reference_ngram_hashes(normalize_text(ITEM), 13))
    assert index.hashes.dtype == np.uint64 and (np.diff(index.hashes.astype(np.float64)) > 0).all()
    texts = ["  one two three  ", "", None, "a b c d e", "x\ty\n\nz w v u"]
    hashes, offsets = NgramHasher(3)(pa.array(texts, pa.string()))
    for i, text in enumerate(texts):
        expected = reference_ngram_hashes(normalize_text(text), 3) if text else []
        assert hashes[offsets[i]:offsets[i + 1]].tolist() == expected, text


def test_first_registered_item_owns_a_shared_ngram_and_index_pickles(index):
    shared = NgramIndex.build(pa.array([ITEM, "intro " + ITEM]), ["s@1:first", "s@1:second"])
    copy = pickle.loads(pickle.dumps(shared))
    matches = copy.match(pa.array([ITEM]))
    assert copy.refs[matches.first_item[0]] == "s@1:first"
    assert matches.counts[0] == len(normalize_text(ITEM).split()) - 12


def test_ascii_fast_path_tokenizes_like_the_unicode_normalization():
    from operators.decontam.ngrams import normalize_for_ngrams

    texts = ["Hello, World! (x+y)^2 = z_1 ~ 50% of `code` [a]{b}|c\\d", "TABS\tand\nNEW-lines; 'quoted' \"q\"",
             "Café «Ünïcode» — “curly” quotes… and NBSP\u00a0here", "ＦＵＬＬＷＩＤＴＨ text", None, ""]
    ours = [t.split() for t in normalize_for_ngrams(pa.array(texts, pa.string())).to_pylist()]
    reference = [normalize_text(t).split() if t else [] for t in texts]
    assert ours == reference


def test_unicode_edits_match_and_bloom_prefilter_is_exact():
    item = "Ünïcode «quotes» and the Café menu: what does the chef recommend on rainy Tuesday evenings in Montréal?"
    index = NgramIndex.build(pa.array([item]), ["u@1:0"])
    assert index.bloom.nbytes * 8 >= 32 * len(index)
    plant = "intro " + item.upper().replace("«", '"').replace("»", '"') + " outro"
    matches = index.match(pa.array([plant, "ünïcode quotes and the café menu"]))
    assert matches.counts[0] == len(index) and matches.counts[1] == 0
    # many random n-grams: those passing the Bloom filter but absent from the index are not counted
    rng = np.random.default_rng(0)
    words = [" ".join(rng.choice(["alpha", "beta", "gamma", "delta", "chef", "menu"], 40)) for _ in range(200)]
    assert index.match(pa.array(words)).counts.sum() == 0


def test_random_batches_agree_with_the_spec():
    rng = np.random.default_rng(5)
    vocabulary = ["a", "bb", "c", "dd", "e", "ff", "Gg", "h.", "  "]
    texts = [" ".join(rng.choice(vocabulary, int(rng.integers(0, 12)))) for _ in range(300)]
    hashes, offsets = NgramHasher(4)(pa.array(texts))
    for i, text in enumerate(texts):
        assert hashes[offsets[i]:offsets[i + 1]].tolist() == reference_ngram_hashes(normalize_text(text), 4), text
