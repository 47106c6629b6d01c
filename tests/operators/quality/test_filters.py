"""Quality and cleaning operators on small hand-made documents (plain pyarrow, no engine)."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

from datahub.operator import apply_batch_operator, build_operator

PROSE = (
    "The library provides a set of tools that help with the reading of files. Each function "
    "takes a path and returns the contents of that file as a string. It is safe to call them "
    "with any path, and they raise an error with a clear message when the file is missing. "
    "Most users will want to start with the high level helpers and move to the lower level "
    "interface only when they have to control buffering and encodings themselves."
)


def run(op: str, texts: list[str], **params):
    table = pa.table({"sample_id": [str(i) for i in range(len(texts))], "text": texts})
    return apply_batch_operator(build_operator(op, params), table, node=op).sort_by("sample_id")


def reasons(out) -> list:
    return out.column("_drop_reason").to_pylist()


def quality(out, name: str) -> list:
    return [q[name] for q in out.column("quality").to_pylist()]


def test_gopher_quality_rules_fire_with_their_reasons():
    texts = [
        PROSE,
        "word " * 10,  # too short
        " ".join(["######!"] * 80),  # symbols only
        "\n".join(f"* item {i} ..." for i in range(80)),  # bullets + ellipses
        " ".join(["buy", "cheap", "deal", "now"] * 30),  # no stop words
        " ".join(["12345", "67890", "2024-01", "3.14159", "the", "of", "words"] * 12),  # few alphabetic words
    ]
    out = run("gopher_quality", texts)
    got = reasons(out)
    assert got[0] is None
    assert got[1] == "gopher_short_doc"
    assert got[2] == "gopher_short_doc"  # symbol words do not count as words
    assert got[3] == "gopher_below_avg_word_length"
    assert got[4] == "gopher_not_enough_stop_words"
    assert got[5] == "gopher_below_alpha_threshold"
    assert quality(out, "gopher_stop_words")[0] >= 5
    assert out.column("_ev.gopher_quality").to_pylist() == ["annotated"] * 6  # signals on every row


def test_gopher_thresholds_are_overridable_and_drop_false_only_annotates():
    short = "the cat and the dog " * 6  # 30 words
    assert reasons(run("gopher_quality", [short])) == ["gopher_short_doc"]
    assert reasons(run("gopher_quality", [short], min_doc_words=20)) == [None]
    out = run("gopher_quality", [short], drop=False)
    assert reasons(out) == [None] and quality(out, "gopher_words") == [30]


def _reference_top(words: list[str], n: int) -> int:
    grams = Counter(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0
    gram, count = grams.most_common(1)[0]
    return max(len(g) * c for g, c in grams.items() if c == count) if count else len(gram) * count


def _reference_dup_chars(words: list[str], n: int) -> int:
    seen, covered = set(), [False] * len(words)
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in seen:
            covered[i:i + n] = [True] * n
        seen.add(gram)
    return sum(len(w) for w, c in zip(words, covered) if c)


def test_vectorized_ngram_statistics_match_a_plain_python_reference():
    from operators.quality import textstats as ts

    rng = random.Random(7)
    vocab = ["a", "bb", "ccc", "dd", "e", "fff"]
    docs = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 60))) for _ in range(40)]
    tokens = ts.words(pa.array(docs))
    ids, lengths = ts.ids(tokens.values), tokens.lengths()
    for n in (2, 3, 5, 7):
        top = ts.top_ngram_chars(ids, lengths, tokens.parents, n, len(docs))
        dup = ts.duplicate_ngram_chars(ids, lengths, tokens.parents, n, len(docs))
        for i, doc in enumerate(docs):
            words = doc.split()
            # the top n-gram's chars: the most frequent gram (ties: any of them has the same count)
            grams = Counter(" ".join(words[j:j + n]) for j in range(len(words) - n + 1))
            if grams:
                best = max(grams.values())
                assert top[i] in {len(g) * best for g, c in grams.items() if c == best}
            else:
                assert top[i] == 0
            assert dup[i] == _reference_dup_chars(words, n), (n, doc)


def test_gopher_repetition_drops_repeated_lines_and_ngrams():
    lines = "\n".join(["Subscribe to the newsletter for more."] * 6 + ["A different closing line here."])
    spam = " ".join(["click here for the best deal"] * 20)
    out = run("gopher_repetition", [PROSE, lines, spam])
    got = reasons(out)
    assert got[0] is None
    assert got[1] == "gopher_dup_para_frac" or got[1].startswith("gopher_dup_line")
    assert got[2] is not None and ("gram" in got[2])
    assert quality(out, "gopher_dup_line_frac")[1] == pytest.approx(5 / 7)


def test_c4_removes_bad_lines_and_drops_lorem_ipsum_and_code():
    doc = "\n".join([
        "This is the first sentence of a proper line. It has two.",
        "Menu",  # too few words, no punctuation
        "Please enable javascript to view this site properly.",
        "We use cookies to improve this website for you.",
        "Here is a third sentence! And a fourth one? Yes, a fifth.",
    ])
    out = run("c4_quality", [doc, "Lorem ipsum dolor sit amet, consectetur.\n" * 6, "Code like x = {1: 2} is here. " * 6])
    got = reasons(out)
    assert got == [None, "c4_lorem_ipsum", "c4_curly_bracket"]
    kept = out.column("text").to_pylist()[0].split("\n")
    assert kept == ["This is the first sentence of a proper line. It has two.",
                    "Here is a third sentence! And a fourth one? Yes, a fifth."]
    assert out.column("_ev.c4_quality").to_pylist()[0] == "modified"
    assert quality(out, "c4_lines_removed_frac")[0] == pytest.approx(3 / 5)


def test_c4_paragraph_mode_joins_wrapped_lines():
    wrapped = "This sentence is wrapped\nacross two lines. And here\nare more sentences. Three.\n\nFour is here. Five too."
    assert reasons(run("c4_quality", [wrapped])) == ["c4_too_few_sentences"]
    out = run("c4_quality", [wrapped], split="paragraphs", remove_lines=False)
    assert reasons(out) == [None] and out.column("text").to_pylist() == [wrapped]


def test_fineweb_rules():
    short_lines = "\n".join(f"line {i}." for i in range(20))
    no_punct = "\n".join("a long line of words without any final mark at all here" for _ in range(3)) + "x"
    dup = PROSE + "\n" + PROSE
    out = run("fineweb_quality", [PROSE, short_lines, no_punct, dup])
    assert reasons(out) == [None, "fineweb_short_line_ratio", "fineweb_line_punct_ratio", "fineweb_char_dup_ratio"]
    relaxed = run("fineweb_quality", [dup], char_duplicates_ratio=0.6)
    assert reasons(relaxed) == [None]


def test_language_id_scores_and_filters():
    texts = [PROSE, "Der schnelle braune Fuchs springt über den faulen Hund, und die Katze schläft im Garten.",
             "Le renard brun rapide saute par-dessus le chien paresseux pendant que le chat dort."]
    out = run("language_id", texts)
    assert quality(out, "language") == ["en", "de", "fr"]
    assert all(0.5 < s <= 1.0 for s in quality(out, "language_score"))
    assert reasons(out) == [None, "language_not_allowed", "language_not_allowed"]
    assert reasons(run("language_id", texts, allowed=["en", "de"])) == [None, None, "language_not_allowed"]


def test_pii_redaction_counts_and_precision():
    text = ("Mail john.doe@example.com or ops@mail.example.org, call +1 415-555-0100 or (415) 555-0199. "
            "Hosts 192.168.1.20 and 2001:db8::8a2e:370:7334 and fe80::1 answer. Version 1.2.3 and 999.1.1.1 are not IPs.")
    out = run("redact_pii", [text, "no personal data here"])
    redacted = out.column("text").to_pylist()[0]
    assert "example.com" not in redacted and "415" not in redacted and "192.168" not in redacted and "2001:db8" not in redacted
    assert "Version 1.2.3" in redacted and "999.1.1.1" in redacted
    assert quality(out, "pii_emails") == [2, 0]
    assert quality(out, "pii_phones") == [2, 0]
    assert quality(out, "pii_ip_addresses") == [3, 0]
    assert out.column("_ev.redact_pii").to_pylist() == ["modified", "annotated"]
    assert reasons(out) == [None, None]


def test_fix_unicode_repairs_mojibake_and_leaves_ascii_alone():
    out = run("fix_unicode", ["The cafÃ© serves crÃ¨me brÃ»lÃ©e.", "plain ascii text", "fish &amp; chips"])
    assert out.column("text").to_pylist() == ["The café serves crème brûlée.", "plain ascii text", "fish & chips"]
    assert out.column("_ev.fix_unicode").to_pylist() == ["modified", None, "modified"]


def test_strip_boilerplate_removes_short_boilerplate_lines_only():
    doc = "Home | About | Contact\nReal content stays here.\nCopyright 2024 Example Inc. All rights reserved.\nMore content."
    long_line = "This paragraph mentions the privacy policy in passing " * 6
    out = run("strip_boilerplate", [doc, long_line])
    assert out.column("text").to_pylist() == ["Real content stays here.\nMore content.", long_line]
    assert quality(out, "boilerplate_lines") == [2, 0]


def test_bad_params_are_rejected_with_the_field_name():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="max_bullet_lines_ratio"):
        build_operator("gopher_quality", {"max_bullet_lines_ratio": 1.5})
    with pytest.raises(ValidationError, match="extra"):
        build_operator("fineweb_quality", {"line_punct": 0.1})


def test_matches_datatrove_decisions_on_clear_cases():
    # datatrove tokenizes words with spacy (installed by the bench extra, which `make test` installs)
    from datatrove.data import Document
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter

    texts = [PROSE, "word " * 10, " ".join(["buy", "cheap", "deal", "now"] * 30),
             "\n".join(["Same line repeated here."] * 10), " ".join(["click here for the best deal"] * 20)]
    for op, peer in (("gopher_quality", GopherQualityFilter()), ("gopher_repetition", GopherRepetitionFilter())):
        ours = [r is None for r in reasons(run(op, texts))]
        theirs = [peer.filter(Document(text=t, id=str(i))) is True for i, t in enumerate(texts)]
        assert ours == theirs, op
