"""Remove boilerplate lines (cookie banners, copyright footers, navigation, share/subscribe
prompts) that survive HTML extraction. Line patterns after the C4 policy-line rule (Raffel et
al. 2020) and the "boilerplate" phrases of Gopher/RefinedWeb line filters.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import BatchOperator, Params, add_quality_signals, register
from operators.quality import textstats as ts

DEFAULT_PATTERNS = (
    r"^(copyright|©|\(c\))\s",  # "Copyright example.org", "© 2024 Foo Inc."
    r"all rights reserved",
    r"(terms of (use|service)|privacy policy|cookie policy|uses cookies|accept (all )?cookies)",
    r"^(home|about|contact|login|sign in|menu)(\s*[|»/·]\s*\w+)+$",  # "Home | About | Contact"
    r"^(share|tweet|like|follow us|subscribe)( (on|to|this))?\b",
    r"^(click here|read more|continue reading|back to top)\b",
    r"^(skip to (main )?content)$",
)


class BoilerplateParams(Params):
    patterns: tuple[str, ...] = DEFAULT_PATTERNS  # RE2 regexes, matched case-insensitively per line
    max_line_chars: int = Field(200, ge=1, description="longer lines are prose, never boilerplate")


@register
class StripBoilerplate(BatchOperator[BoilerplateParams]):
    """Drop short lines matching boilerplate patterns; count them in ``quality.boilerplate_lines``."""

    name = "strip_boilerplate"
    version = "1"
    Params = BoilerplateParams
    annotates = True

    def process(self, table: pa.Table) -> pa.Table:
        p: BoilerplateParams = self.params
        original = table.column("text")
        lines = ts.split(original, "\n")
        stripped = pc.utf8_lower(pc.utf8_trim_whitespace(lines.values))
        pattern = "|".join(f"(?:{x})" for x in p.patterns)
        hit = np.asarray(pc.match_substring_regex(stripped, pattern).to_numpy(zero_copy_only=False), dtype=bool)
        hit &= lines.lengths() <= p.max_line_chars
        removed = lines.per_doc(hit.astype(np.float64)).astype(np.int64)
        table = add_quality_signals(table, {"boilerplate_lines": pa.array(removed)})
        if not hit.any():
            return table
        text = pc.if_else(pa.array(removed > 0), pc.utf8_trim_whitespace(ts.rebuild(lines, ~hit, "\n")), original)
        return table.set_column(table.column_names.index("text"), "text", text)
