"""What the commands check of the values they are given beyond their types.

An empty value is what a script passes for an unset variable (``--lake "$LAKE"``, ``--out "$OUT"``): read as a
path it is the current directory, so a report was written into the repository a cron job ran in and a lake was
looked for there ("nothing quarantined", exit 0). It is refused, naming the option.
"""

from __future__ import annotations

from datahub.errors import SpecError


def given(value: str | None, option: str, *, what: str) -> str | None:
    """``value`` unless it is empty or blank (then a SpecError naming ``option`` and what it takes); None stays."""
    if value is not None and not value.strip():
        raise SpecError(f"{option} is empty (an unset variable?); give {what}")
    return value
