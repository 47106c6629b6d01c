import pyarrow as pa

from operators.dedup.normalize import NO_NORMALIZATION, Normalization, normalize_text, normalize_texts


def test_default_normalization():
    assert normalize_text("Hello,   WORLD!\n\tIt's  ﬁne\u00a0here.") == "hello world it s fine here"


def test_each_step_toggles():
    text = "Ａbc, DEF  ghi"
    assert normalize_text(text, NO_NORMALIZATION) == text
    assert normalize_text(text, Normalization(unicode_nfkc=True, lowercase=False, strip_punctuation=False, collapse_whitespace=False)) == "Abc, DEF  ghi"
    assert normalize_text(text, Normalization(False, True, False, False)) == "ａbc, def  ghi"
    assert normalize_text(text, Normalization(False, False, True, False)) == "Ａbc  DEF  ghi"
    assert normalize_text(text, Normalization(False, False, False, True)) == "Ａbc, DEF ghi"


def test_nulls_stay_null_and_column_is_vectorized():
    out = normalize_texts(pa.chunked_array([pa.array(["A  B", None]), pa.array(["C!"])]))
    assert out.to_pylist() == ["a b", None, "c"]


def _random_rows(seed: int, count: int) -> list[str | None]:
    import random
    import string

    rng = random.Random(seed)
    ascii_chars = string.printable + "\x00\x01\x7f"
    other_chars = ascii_chars + "é\u00a0ﬁＡ\u3000—“”"
    rows: list[str | None] = ["", " ", "   ", " a ", "a  b", "\t\n", "A.B", "  x  y  ", "end.", "(x) "]
    for _ in range(count):
        chars = ascii_chars if rng.random() < 0.7 else other_chars
        rows.append(None if rng.random() < 0.05 else "".join(rng.choice(chars) for _ in range(rng.randint(0, 40))))
    return rows


def test_the_ascii_byte_path_equals_the_unicode_kernels_for_every_step_combination():
    from itertools import product

    from operators.dedup.normalize import unicode_normalize_texts

    rows = pa.array(_random_rows(7, 5000), pa.string())
    inputs = [rows, rows.slice(13, 2000), pa.chunked_array([rows.slice(0, 97), rows.slice(97)]),
              pa.array([r for r in rows.to_pylist() if r is None or r.isascii()], pa.string())]
    for flags in product((False, True), repeat=4):
        normalization = Normalization(*flags)
        for texts in inputs:
            got = normalize_texts(texts, normalization)
            assert got.type == pa.string()
            assert got.to_pylist() == unicode_normalize_texts(texts, normalization).to_pylist(), flags
