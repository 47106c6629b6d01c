"""language_id's block scoring against langid's own per-document classify()."""

from __future__ import annotations

import random

import pytest

from operators.quality import language
from operators.quality.language import _identifier, classify_texts

TEXTS = [
    "The library provides a set of tools that help with the reading of files and returns strings.",
    "Der schnelle braune Fuchs springt über den faulen Hund, und die Katze schläft im Garten.",
    "Le renard brun rapide saute par-dessus le chien paresseux pendant que le chat dort.",
    "El rápido zorro marrón salta sobre el perro perezoso mientras el gato duerme.",
    "", "   \n", "a", "1234 5678", "!!! ???", "ok",
]


def _reference(texts, candidates=None):
    identifier = _identifier(candidates)
    return [identifier.classify(t) if t.strip() else ("und", 0.0) for t in texts]


def _noise(n: int) -> list[str]:
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz äöüéèñ.,"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(n)]


def test_labels_and_scores_equal_langid_classify_across_blocks():
    texts = TEXTS + _noise(600)  # more than two blocks of _BLOCK documents
    assert len(texts) > 2 * language._BLOCK
    assert classify_texts(texts) == _reference(texts)


def test_candidate_languages_restrict_like_set_languages():
    candidates = ("de", "fr")
    got = classify_texts(TEXTS, candidates=candidates)
    assert got == _reference(TEXTS, candidates)
    assert {lang for lang, _ in got} <= {"de", "fr", "und"}


def test_near_tie_fallback_uses_langid_normalization(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(language, "_TIE_GAP", float("inf"))  # every row takes the exact fallback path
    texts = TEXTS + _noise(50)
    assert classify_texts(texts) == _reference(texts)
