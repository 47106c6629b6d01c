"""Whitespace and Unicode normalization of ``text`` (vectorized with pyarrow.compute)."""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from pydantic import Field

from datahub.operator import BatchOperator, Params, register


class NormalizeParams(Params):
    unicode_form: Literal["NFC", "NFKC", "none"] = "NFC"
    collapse_spaces: bool = True  # runs of spaces/tabs -> one space
    max_blank_lines: int = Field(1, ge=0, le=10)  # at most this many empty lines in a row
    strip: bool = True


@register
class NormalizeText(BatchOperator[NormalizeParams]):
    """Normalize Unicode and whitespace so equal documents look equal to later steps."""

    name = "normalize_text"
    version = "1"
    Params = NormalizeParams

    def process(self, table: pa.Table) -> pa.Table:
        p: NormalizeParams = self.params
        text = table.column("text")
        if p.unicode_form != "none":
            text = pc.utf8_normalize(text, form=p.unicode_form)
        text = pc.replace_substring_regex(text, pattern=r"\r\n?", replacement="\n")
        if p.collapse_spaces:
            text = pc.replace_substring_regex(text, pattern="[ \t\u00a0]+", replacement=" ")
            text = pc.replace_substring_regex(text, pattern=r" ?\n ?", replacement="\n")
        blank = "\n" * (p.max_blank_lines + 1)
        text = pc.replace_substring_regex(text, pattern=r"\n{%d,}" % (p.max_blank_lines + 2), replacement=blank)
        if p.strip:
            text = pc.utf8_trim_whitespace(text)
        return table.set_column(table.column_names.index("text"), "text", text)
