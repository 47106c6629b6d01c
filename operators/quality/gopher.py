"""Gopher quality and repetition rules (Rae et al. 2021, "Scaling Language Models: Methods,
Analysis & Insights from Training Gopher", appendix A.1.1 and table A1).

Defaults are the published thresholds, as also used by datatrove's ``GopherQualityFilter``
and ``GopherRepetitionFilter``. Words are whitespace tokens with surrounding punctuation
trimmed (datatrove uses a spaCy tokenizer, so counts differ slightly on punctuation).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import register
from operators.quality import textstats as ts
from operators.quality.base import FilterParams, QualityFilter

# Rae et al. 2021, A.1.1: "the, be, to, of, and, that, have, with".
GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")


class GopherQualityParams(FilterParams):
    # Rae et al. 2021, A.1.1: keep documents of 50..100,000 words ...
    min_doc_words: int | None = Field(50, ge=0)
    max_doc_words: int | None = Field(100_000, ge=1)
    # ... with a mean word length of 3..10 characters ...
    min_avg_word_length: float | None = Field(3, ge=0)
    max_avg_word_length: float | None = Field(10, ge=0)
    # ... a symbol-to-word ratio (hash, ellipsis) of at most 0.1 ...
    max_symbol_word_ratio: float | None = Field(0.1, ge=0)
    # ... at most 90% of lines starting with a bullet and 30% ending with an ellipsis ...
    max_bullet_lines_ratio: float | None = Field(0.9, ge=0, le=1)
    max_ellipsis_lines_ratio: float | None = Field(0.3, ge=0, le=1)
    # ... at least 80% of words with an alphabetic character ...
    min_alpha_words_ratio: float | None = Field(0.8, ge=0, le=1)
    # ... and at least two of the stop words.
    min_stop_words: int | None = Field(2, ge=0)
    stop_words: tuple[str, ...] = GOPHER_STOP_WORDS
    # datatrove counts "•" and "-"; "*" is the other common bullet in scraped/markdown text.
    bullet_prefixes: tuple[str, ...] = ("•", "-", "*", "‣", "◦", "▪")


@register
class GopherQuality(QualityFilter[GopherQualityParams]):
    """Gopher's document-quality heuristics: length, word length, symbols, bullets, alpha, stop words."""

    name = "gopher_quality"
    version = "1"
    Params = GopherQualityParams

    def signals(self, table: pa.Table) -> dict[str, np.ndarray | pa.Array]:
        p: GopherQualityParams = self.params
        text = table.column("text")
        tokens = ts.words(text)
        trimmed = pc.utf8_trim(tokens.values, characters=ts.PUNCTUATION)
        trimmed_len = np.asarray(pc.utf8_length(trimmed).to_numpy(zero_copy_only=False), dtype=np.float64)
        non_symbol = trimmed_len > 0
        n_tokens = tokens.per_doc()
        n_words = tokens.per_doc(non_symbol.astype(np.float64))
        alpha = np.asarray(pc.match_substring_regex(tokens.values, r"\pL").to_numpy(zero_copy_only=False), dtype=np.float64)
        lowered = pc.utf8_lower(trimmed)
        stop_index = pc.index_in(lowered, value_set=pa.array(list(p.stop_words), pa.string()))
        hit = np.asarray(pc.is_valid(stop_index).to_numpy(zero_copy_only=False))
        distinct = np.unique(tokens.parents[hit] * (len(p.stop_words) + 1) + ts.to_numpy(stop_index, np.int64)[hit])
        stop_words = np.bincount(distinct // (len(p.stop_words) + 1), minlength=tokens.num_docs).astype(np.float64)

        symbols = ts.to_numpy(pc.count_substring(text, "#")) 
        ellipses = ts.to_numpy(pc.count_substring(text, "...")) + ts.to_numpy(pc.count_substring(text, "…"))
        lines = ts.split(text, "\n")
        stripped = pc.utf8_trim_whitespace(lines.values)
        bullet_pattern = "^(" + "|".join(_re_escape(b) for b in p.bullet_prefixes) + ")"
        bullets = np.asarray(pc.match_substring_regex(stripped, bullet_pattern).to_numpy(zero_copy_only=False), dtype=np.float64)
        ellipsis_end = np.asarray(pc.match_substring_regex(stripped, r"(\.\.\.|…)$").to_numpy(zero_copy_only=False), dtype=np.float64)
        n_lines = lines.per_doc()
        return {
            "gopher_words": n_words,
            "gopher_mean_word_length": ts.ratio(tokens.per_doc(np.where(non_symbol, trimmed_len, 0)), n_words),
            "gopher_hash_ratio": ts.ratio(symbols, n_tokens),
            "gopher_ellipsis_ratio": ts.ratio(ellipses, n_tokens),
            "gopher_bullet_lines_ratio": ts.ratio(lines.per_doc(bullets), n_lines),
            "gopher_ellipsis_lines_ratio": ts.ratio(lines.per_doc(ellipsis_end), n_lines),
            "gopher_alpha_words_ratio": ts.ratio(tokens.per_doc(alpha), n_tokens),
            "gopher_stop_words": stop_words,
        }

    def rules(self, s: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        p: GopherQualityParams = self.params
        rules: list[tuple[str, np.ndarray]] = []

        def rule(name: str, limit: float | None, failing: np.ndarray) -> None:
            if limit is not None:
                rules.append((name, failing))

        rule("gopher_short_doc", p.min_doc_words, s["gopher_words"] < (p.min_doc_words or 0))
        rule("gopher_long_doc", p.max_doc_words, s["gopher_words"] > (p.max_doc_words or np.inf))
        rule("gopher_below_avg_word_length", p.min_avg_word_length, s["gopher_mean_word_length"] < (p.min_avg_word_length or 0))
        rule("gopher_above_avg_word_length", p.max_avg_word_length, s["gopher_mean_word_length"] > (p.max_avg_word_length or np.inf))
        rule("gopher_too_many_hashes", p.max_symbol_word_ratio, s["gopher_hash_ratio"] > (p.max_symbol_word_ratio or np.inf))
        rule("gopher_too_many_ellipsis", p.max_symbol_word_ratio, s["gopher_ellipsis_ratio"] > (p.max_symbol_word_ratio or np.inf))
        rule("gopher_too_many_bullets", p.max_bullet_lines_ratio, s["gopher_bullet_lines_ratio"] > (p.max_bullet_lines_ratio or np.inf))
        rule("gopher_too_many_end_ellipsis", p.max_ellipsis_lines_ratio,
             s["gopher_ellipsis_lines_ratio"] > (p.max_ellipsis_lines_ratio or np.inf))
        rule("gopher_below_alpha_threshold", p.min_alpha_words_ratio, s["gopher_alpha_words_ratio"] < (p.min_alpha_words_ratio or 0))
        rule("gopher_not_enough_stop_words", p.min_stop_words, s["gopher_stop_words"] < (p.min_stop_words or 0))
        return rules


def _re_escape(text: str) -> str:
    return "".join("\\" + ch if ch in r".^$*+?{}[]\|()-" else ch for ch in text)


class GopherRepetitionParams(FilterParams):
    # Rae et al. 2021, table A1 (the same defaults as datatrove's GopherRepetitionFilter).
    dup_line_frac: float | None = Field(0.3, ge=0, le=1)
    dup_para_frac: float | None = Field(0.3, ge=0, le=1)
    dup_line_char_frac: float | None = Field(0.2, ge=0, le=1)
    dup_para_char_frac: float | None = Field(0.2, ge=0, le=1)
    top_n_grams: dict[int, float] = Field(default_factory=lambda: {2: 0.2, 3: 0.18, 4: 0.16})
    dup_n_grams: dict[int, float] = Field(default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10})


@register
class GopherRepetition(QualityFilter[GopherRepetitionParams]):
    """Gopher's repetition rules: duplicate lines/paragraphs and repeated word n-grams."""

    name = "gopher_repetition"
    version = "1"
    Params = GopherRepetitionParams

    def signals(self, table: pa.Table) -> dict[str, np.ndarray | pa.Array]:
        p: GopherRepetitionParams = self.params
        text = table.column("text")
        chars = ts.to_numpy(pc.utf8_length(pc.fill_null(text, "")))
        paragraphs = ts.split(pc.utf8_trim_whitespace(pc.fill_null(text, "")), r"\n{2,}", regex=True)
        para_dups, para_chars = ts.duplicate_stats(paragraphs)
        lines = ts.split(text, r"\n+", regex=True)
        line_dups, line_chars = ts.duplicate_stats(lines)
        out: dict[str, np.ndarray | pa.Array] = {
            "gopher_dup_para_frac": ts.ratio(para_dups, paragraphs.per_doc()),
            "gopher_dup_para_char_frac": ts.ratio(para_chars, chars),
            "gopher_dup_line_frac": ts.ratio(line_dups, lines.per_doc()),
            "gopher_dup_line_char_frac": ts.ratio(line_chars, chars),
        }
        tokens = ts.words(text)
        word_ids = ts.ids(tokens.values)
        lengths = tokens.lengths()
        for n in sorted(p.top_n_grams):
            out[f"gopher_top_{n}_gram_frac"] = ts.ratio(ts.top_ngram_chars(word_ids, lengths, tokens.parents, n, tokens.num_docs), chars)
        for n in sorted(p.dup_n_grams):
            out[f"gopher_dup_{n}_gram_frac"] = ts.ratio(ts.duplicate_ngram_chars(word_ids, lengths, tokens.parents, n, tokens.num_docs), chars)
        return out

    def rules(self, s: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        p: GopherRepetitionParams = self.params
        rules = [
            (name, s[f"gopher_{name}"] > limit)
            for name, limit in (("dup_para_frac", p.dup_para_frac), ("dup_para_char_frac", p.dup_para_char_frac),
                                ("dup_line_frac", p.dup_line_frac), ("dup_line_char_frac", p.dup_line_char_frac))
            if limit is not None
        ]
        rules += [(f"top_{n}_gram", s[f"gopher_top_{n}_gram_frac"] > p.top_n_grams[n]) for n in sorted(p.top_n_grams)]
        rules += [(f"duplicated_{n}_n_grams", s[f"gopher_dup_{n}_gram_frac"] > p.dup_n_grams[n]) for n in sorted(p.dup_n_grams)]
        return [(f"gopher_{name}", failing) for name, failing in rules]
