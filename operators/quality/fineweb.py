"""FineWeb's extra quality rules (Penedo et al. 2024, "The FineWeb Datasets: Decanting the Web
for the Finest Text Data at Scale", section 3.3; datatrove ``FineWebQualityFilter`` defaults).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import register
from operators.quality import textstats as ts
from operators.quality.base import FilterParams, QualityFilter

# Line-ending punctuation (datatrove utils.text.TERMINAL_PUNCTUATION, common subset).
TERMINAL_PUNCTUATION = (".", "!", "?", "\"", "'", "”", "’", "…", "。", "！", "？", "؟", "।", "॥", "։", "؛")


class FineWebParams(FilterParams):
    # Penedo et al. 2024, 3.3: drop if under 12% of lines end with punctuation ...
    line_punct_thr: float | None = Field(0.12, ge=0, le=1)
    line_punct_exclude_zero: bool = False
    stop_chars: tuple[str, ...] = TERMINAL_PUNCTUATION
    # ... if over 67% of lines are short (<= 30 characters) ...
    short_line_thr: float | None = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=1)
    # ... if over 1% of characters are in duplicated lines ...
    char_duplicates_ratio: float | None = Field(0.01, ge=0, le=1)
    # ... and (datatrove) if there are more than 0.3 newlines per word (lists).
    new_line_ratio: float | None = Field(0.3, ge=0)


@register
class FineWebQuality(QualityFilter[FineWebParams]):
    """FineWeb's rules: line-ending punctuation, short lines, duplicated-line characters, list-like text."""

    name = "fineweb_quality"
    version = "1"
    Params = FineWebParams

    def signals(self, table: pa.Table) -> dict[str, np.ndarray | pa.Array]:
        p: FineWebParams = self.params
        text = pc.fill_null(table.column("text"), "")
        all_lines = ts.split(text, "\n")
        nonblank = np.asarray(pc.invert(pc.equal(pc.utf8_trim_whitespace(all_lines.values), "")).to_numpy(zero_copy_only=False), dtype=bool)
        lines = all_lines.select(nonblank)
        n_lines = lines.per_doc()
        pattern = "(" + "|".join(_escape(c) for c in p.stop_chars) + ")$"
        punct = np.asarray(pc.match_substring_regex(lines.values, pattern).to_numpy(zero_copy_only=False), dtype=np.float64)
        short = (lines.lengths() <= p.short_line_length).astype(np.float64)
        _, dup_chars = ts.duplicate_stats(lines)
        chars_no_newline = ts.to_numpy(pc.utf8_length(text)) - ts.to_numpy(pc.count_substring(text, "\n"))
        n_words = ts.words(text).per_doc()
        return {
            "fineweb_lines": n_lines,
            "fineweb_line_punct_ratio": ts.ratio(lines.per_doc(punct), n_lines),
            "fineweb_short_line_ratio": ts.ratio(lines.per_doc(short), n_lines),
            "fineweb_char_dup_ratio": ts.ratio(dup_chars, chars_no_newline),
            "fineweb_newline_ratio": ts.ratio(ts.to_numpy(pc.count_substring(text, "\n")), n_words, empty=np.inf),
        }

    def rules(self, s: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        p: FineWebParams = self.params
        rules = [("fineweb_empty", s["fineweb_lines"] == 0)]
        if p.line_punct_thr is not None:
            low = s["fineweb_line_punct_ratio"] < p.line_punct_thr
            if p.line_punct_exclude_zero:
                low &= s["fineweb_line_punct_ratio"] > 0
            rules.append(("fineweb_line_punct_ratio", low))
        if p.short_line_thr is not None:
            rules.append(("fineweb_short_line_ratio", s["fineweb_short_line_ratio"] > p.short_line_thr))
        if p.char_duplicates_ratio is not None:
            rules.append(("fineweb_char_dup_ratio", s["fineweb_char_dup_ratio"] > p.char_duplicates_ratio))
        if p.new_line_ratio is not None:
            rules.append(("fineweb_list_ratio", s["fineweb_newline_ratio"] > p.new_line_ratio))
        return rules


def _escape(ch: str) -> str:
    return "\\" + ch if ch in r".^$*+?{}[]\|()" else ch
