"""C4 line and document rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning
with a Unified Text-to-Text Transformer", section 2.2; reference code: tensorflow_datasets
``c4_utils.py``; datatrove's ``C4QualityFilter`` has the same defaults).

Lines that fail a line rule are removed from ``text`` (C4 does this); documents with lorem
ipsum, a curly bracket or too few sentences left are dropped. Not implemented: the bad-words
list (it is a download; datatrove's ``C4BadWordsFilter`` fetches it at run time).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import add_quality_signals, register
from operators.quality import textstats as ts
from operators.quality.base import FilterParams, QualityFilter, first_failure

CITATION_PATTERN = r"\[\d*\]|\[edit\]|\[citation needed\]"  # Wikipedia-style citations (c4_utils.py)
POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


class C4Params(FilterParams):
    # "lines": C4 splits on newlines. "paragraphs": split on blank lines and join hard-wrapped
    # lines first (for corpora like docstrings or e-mails where a newline is not a line end).
    split: Literal["lines", "paragraphs"] = "lines"
    remove_citations: bool = True
    filter_no_terminal_punct: bool = True  # C4: keep lines ending in . ! ? "
    min_num_sentences: int | None = Field(5, ge=0)  # C4: drop pages with fewer than 5 sentences
    min_words_per_line: int | None = Field(3, ge=0)  # C4: keep lines with at least 3 words
    max_word_length: int | None = Field(1000, ge=1)  # c4_utils.py: drop lines with a word over 1000 chars
    filter_lorem_ipsum: bool = True  # C4: drop pages containing "lorem ipsum"
    filter_javascript: bool = True  # C4: drop lines mentioning javascript
    filter_curly_bracket: bool = True  # C4: drop pages with "{" (code)
    filter_policy: bool = True  # c4_utils.py: drop cookie / terms-of-use lines
    remove_lines: bool = True  # False: keep text unchanged, only annotate and drop documents


@register
class C4Quality(QualityFilter[C4Params]):
    """C4's heuristics: terminal punctuation, words per line, javascript/policy lines, lorem ipsum, code."""

    name = "c4_quality"
    version = "1"
    Params = C4Params

    def process(self, table: pa.Table) -> pa.Table:
        p: C4Params = self.params
        text = pc.fill_null(table.column("text"), "")
        if p.split == "paragraphs":
            text = pc.replace_substring_regex(text, pattern=r"\n[ \t]*(\n[ \t]*)+", replacement="\x00")
            text = pc.replace_substring_regex(text, pattern=r"[ \t]*\n[ \t]*", replacement=" ")
            lines = ts.split(text, "\x00")
        else:
            lines = ts.split(text, "\n")
        line = pc.utf8_trim_whitespace(lines.values)
        n = len(line)
        words = ts.words(line)
        word_count = words.per_doc()
        too_long = np.zeros(n, dtype=bool)
        if p.max_word_length is not None and len(words.values):
            longest = np.zeros(n, dtype=np.int64)
            np.maximum.at(longest, words.parents, words.lengths())
            too_long = longest > p.max_word_length
        if p.remove_citations:
            line = pc.replace_substring_regex(line, pattern=CITATION_PATTERN, replacement="")
        lower = pc.utf8_lower(line)

        def matches(values: pa.Array, pattern: str) -> np.ndarray:
            return np.asarray(pc.match_substring_regex(values, pattern).to_numpy(zero_copy_only=False), dtype=bool)

        no_punct = np.zeros(n, dtype=bool)
        if p.filter_no_terminal_punct:
            no_punct = ~matches(line, r"[.?!\"']$") | matches(line, r"\.\.\.$")
        few_words = word_count < (p.min_words_per_line or 0)
        removed = too_long | no_punct | few_words  # lines reaching the document checks are the rest
        javascript = matches(lower, "javascript") if p.filter_javascript else np.zeros(n, dtype=bool)
        policy = matches(lower, "|".join(POLICY_SUBSTRINGS)) if p.filter_policy else np.zeros(n, dtype=bool)
        lorem = ~removed & matches(lower, "lorem ipsum") if p.filter_lorem_ipsum else np.zeros(n, dtype=bool)
        curly = ~removed & ~javascript & matches(line, r"\{") if p.filter_curly_bracket else np.zeros(n, dtype=bool)
        keep = ~(removed | javascript | policy)
        # Sentences in kept lines: runs of terminal punctuation followed by space or the end.
        sentences = np.maximum(ts.to_numpy(pc.count_substring_regex(line, r"[.?!]+(\s|$)")), 1)
        num_sentences = lines.per_doc(np.where(keep, sentences, 0).astype(np.float64))
        total_lines = lines.per_doc()
        kept_lines = lines.per_doc(keep.astype(np.float64))
        signals = {
            "c4_lines_removed_frac": pa.array(ts.ratio(total_lines - kept_lines, total_lines)),
            "c4_sentences": pa.array(num_sentences),
        }
        table = add_quality_signals(table, signals)
        if p.remove_lines:
            new_text = ts.rebuild(ts.Parts(line, lines.parents, lines.num_docs), keep, "\n" if p.split == "lines" else "\n\n")
            new_text = pc.utf8_trim_whitespace(new_text)
            table = table.set_column(table.column_names.index("text"), "text", new_text)
        if not p.drop:
            return table
        rules = [
            ("c4_lorem_ipsum", lines.per_doc(lorem.astype(np.float64)) > 0),
            ("c4_curly_bracket", lines.per_doc(curly.astype(np.float64)) > 0),
            ("c4_too_few_sentences", num_sentences < (p.min_num_sentences or 0)),
        ]
        reason = first_failure(rules, table.num_rows)
        return self.mark_dropped(table, pa.array(reason != ""), pa.array(reason, pa.string()))
