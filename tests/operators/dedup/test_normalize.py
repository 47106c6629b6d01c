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
