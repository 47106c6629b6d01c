"""PII redaction: e-mail addresses, IPv4/IPv6 addresses and phone numbers, replaced by
placeholders with pyarrow.compute regexes (RE2, linear time). Counts per sample go to
``quality.pii_*``; the engine wrapper records a "modified" lineage event when text changes.

The patterns follow datatrove's ``PIIFormatter`` (e-mail, IP) and the BigScience/StarCoder
PII pipelines; they favour precision (version strings like 1.2.3 are not IPs; a phone
number needs separators or a leading +).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.operator import BatchOperator, Params, add_quality_signals, register
from operators.quality import textstats as ts

EMAIL = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = rf"\b{_OCTET}(?:\.{_OCTET}){{3}}\b"
_H = r"[0-9A-Fa-f]{1,4}"
IPV6 = (
    r"(?:"
    rf"(?:{_H}:){{7}}{_H}"  # full form
    rf"|(?:{_H}:){{1,7}}:"  # trailing ::
    rf"|(?:{_H}:){{1,6}}:{_H}"
    rf"|(?:{_H}:){{1,5}}(?::{_H}){{1,2}}"
    rf"|(?:{_H}:){{1,4}}(?::{_H}){{1,3}}"
    rf"|(?:{_H}:){{1,3}}(?::{_H}){{1,4}}"
    rf"|(?:{_H}:){{1,2}}(?::{_H}){{1,5}}"
    rf"|{_H}:(?::{_H}){{1,6}}"
    rf"|::(?:{_H}:){{0,5}}{_H}"  # leading ::
    r")"
)
# +CC then 6-14 more digits in groups, or a 3-3-4 / (3) 3-4 national number with separators.
PHONE = (
    r"(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,3}"
    r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}"
    r"|\b\d{3}[.-]\d{3}[.-]\d{4})\b"
)


class PiiParams(Params):
    emails: bool = True
    ip_addresses: bool = True
    phone_numbers: bool = True
    email_replacement: str = "<EMAIL>"
    ip_replacement: str = "<IP_ADDRESS>"
    phone_replacement: str = "<PHONE>"


@register
class RedactPii(BatchOperator[PiiParams]):
    """Replace e-mails, IP addresses and phone numbers in ``text``; count them per sample."""

    name = "redact_pii"
    version = "1"
    Params = PiiParams
    annotates = True

    def process(self, table: pa.Table) -> pa.Table:
        p: PiiParams = self.params
        text = pc.fill_null(table.column("text"), "")
        counts: dict[str, np.ndarray] = {}
        # Order matters: e-mails first (they may contain digits), IPv6 before IPv4 (::ffff:1.2.3.4).
        steps = [
            ("pii_emails", p.emails, EMAIL, p.email_replacement),
            ("pii_ipv6", p.ip_addresses, rf"(?:^|[^0-9A-Za-z:])({IPV6})(?:$|[^0-9A-Za-z:])", p.ip_replacement),
            ("pii_ipv4", p.ip_addresses, IPV4, p.ip_replacement),
            ("pii_phones", p.phone_numbers, PHONE, p.phone_replacement),
        ]
        for name, enabled, pattern, replacement in steps:
            if not enabled:
                continue
            counts[name] = ts.to_numpy(pc.count_substring_regex(text, pattern), np.int64)
            if name == "pii_ipv6":  # keep the delimiters matched around the address
                text = pc.replace_substring_regex(text, pattern=rf"(^|[^0-9A-Za-z:]){IPV6}($|[^0-9A-Za-z:])",
                                                  replacement=rf"\1{replacement}\2")
            else:
                text = pc.replace_substring_regex(text, pattern=pattern, replacement=replacement)
        if "pii_ipv6" in counts:
            counts["pii_ip_addresses"] = counts.pop("pii_ipv6") + counts.pop("pii_ipv4")
        table = add_quality_signals(table, {name: pa.array(values) for name, values in counts.items()})
        # Untouched rows keep their original (possibly null) text, so no spurious "modified".
        changed = pc.fill_null(pc.not_equal(text, pc.fill_null(table.column("text"), "")), False)
        text = pc.if_else(changed, text, table.column("text"))
        return table.set_column(table.column_names.index("text"), "text", text)
