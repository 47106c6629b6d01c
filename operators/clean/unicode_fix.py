"""Repair mojibake and broken Unicode with ftfy (Speer 2019), e.g. "cafÃ©" -> "café"."""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from datahub.operator import BatchOperator, Params, register

# Only these rows can need ftfy: non-ASCII, an HTML entity, or an ASCII control character.
_NEEDS_FIX = r"[^\x09\x0a\x0d\x20-\x7e]|&[#A-Za-z0-9]+;"


class FixUnicodeParams(Params):
    normalization: Literal["NFC", "NFKC", "NFD", "NFKD"] | None = "NFC"
    unescape_html: bool | Literal["auto"] = "auto"
    fix_latin_ligatures: bool = True
    uncurl_quotes: bool = False  # keep typographic quotes (they carry meaning in prose)


@register
class FixUnicode(BatchOperator[FixUnicodeParams]):
    """ftfy.fix_text on the rows that can need it (a vectorized pre-check skips plain ASCII)."""

    name = "fix_unicode"
    version = "1"
    Params = FixUnicodeParams
    requires = (("ftfy", "ftfy>=6"),)

    def process(self, table: pa.Table) -> pa.Table:
        import ftfy

        p: FixUnicodeParams = self.params
        config = ftfy.TextFixerConfig(normalization=p.normalization, unescape_html=p.unescape_html,
                                      fix_latin_ligatures=p.fix_latin_ligatures, uncurl_quotes=p.uncurl_quotes)
        text = table.column("text").combine_chunks()
        candidates = pc.fill_null(pc.match_substring_regex(text, _NEEDS_FIX), False)
        index = pc.indices_nonzero(candidates).to_pylist()
        if not index:
            return table
        values = text.to_pylist()
        for i in index:  # ftfy works on one Python string at a time
            values[i] = ftfy.fix_text(values[i], config=config)
        return table.set_column(table.column_names.index("text"), "text", pa.array(values, text.type))
