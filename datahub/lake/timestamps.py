"""Date-times as datahub's JSON output prints them: ISO 8601 in UTC with a 'Z' and microseconds
(``2026-12-07T21:58:07.876950Z``), the 'Z' form of the export manifest's ``created`` and OpenLineage's
``eventTime``; one fixed width, so the strings sort as the times do."""

from __future__ import annotations

from datetime import datetime, timezone


def iso_utc(value: datetime | None) -> str | None:
    """``value`` as ISO 8601 UTC with 'Z' (a naive datetime is taken as UTC, as the lake's tables store it)."""
    if value is None:
        return None
    moment = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def iso_utc_from_millis(millis: int | float | None) -> str | None:
    """Epoch milliseconds (a Delta commit's ``timestamp``) as ``iso_utc`` prints them."""
    return None if millis is None else iso_utc(datetime.fromtimestamp(millis / 1000, timezone.utc))
