"""Text normalization before dedup hashing, so trivial variants hash alike.

Each step is a toggle and a whole-column pyarrow.compute kernel (no Python per row).
Order (as in datatrove's ``simplify_text``): Unicode NFKC, lowercase, punctuation and
symbols to spaces, whitespace runs to one space and trimmed. Converting punctuation to
spaces rather than deleting it keeps "end.Start" two words, like datatrove.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

# RE2 classes: \p{P} punctuation, \p{S} symbols; \s is ASCII only in RE2, so add \p{Z}
# (Unicode separators such as U+00A0, U+3000) and \x0b (vertical tab).
_PUNCTUATION = r"[\p{P}\p{S}]"
_WHITESPACE_RUN = r"[\s\p{Z}\x0b]+"


@dataclass(frozen=True)
class Normalization:
    """Which normalization steps to apply; all on by default."""

    unicode_nfkc: bool = True
    lowercase: bool = True
    strip_punctuation: bool = True
    collapse_whitespace: bool = True


DEFAULT_NORMALIZATION = Normalization()
NO_NORMALIZATION = Normalization(False, False, False, False)


def normalize_texts(
    texts: pa.Array | pa.ChunkedArray, normalization: Normalization = DEFAULT_NORMALIZATION
) -> pa.Array | pa.ChunkedArray:
    """Normalize a string column; nulls stay null."""
    if normalization.unicode_nfkc:
        texts = pc.utf8_normalize(texts, form="NFKC")
    if normalization.lowercase:
        texts = pc.utf8_lower(texts)
    if normalization.strip_punctuation:
        texts = pc.replace_substring_regex(texts, pattern=_PUNCTUATION, replacement=" ")
    if normalization.collapse_whitespace:
        texts = pc.replace_substring_regex(texts, pattern=_WHITESPACE_RUN, replacement=" ")
        texts = pc.utf8_trim(texts, characters=" ")
    return texts


def normalize_text(text: str, normalization: Normalization = DEFAULT_NORMALIZATION) -> str:
    """One string, through the same kernels (for tests and interactive use)."""
    result = normalize_texts(pa.array([text], pa.string()), normalization)
    return result[0].as_py()
