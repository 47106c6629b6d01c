"""Cron expressions: the five standard fields (Kubernetes CronJob and Airflow both accept them)."""

from __future__ import annotations

import re

MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
# (name, low, high, names usable in the field)
FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
    ("day of week", 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)
_ITEM = re.compile(r"^(\*|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/([0-9]+))?$")
EXAMPLE = "'0 3 * * *' (03:00 every day)"


def validate_cron(expression: str) -> str:
    """Return ``expression`` normalized (single spaces) or raise ValueError saying which field is wrong."""
    text = " ".join(str(expression).split())
    if text.lower() in MACROS:
        return text.lower()
    parts = text.split(" ")
    if len(parts) != 5:
        raise ValueError(
            f"cron expression {expression!r} has {len(parts)} fields; use 5 (minute hour day-of-month month "
            f"day-of-week), e.g. {EXAMPLE}, or one of {', '.join(MACROS)}"
        )
    for part, (name, low, high, names) in zip(parts, FIELDS):
        for item in part.lower().split(","):
            _check_item(item, name, low, high, names, expression)
    return text


def _check_item(item: str, name: str, low: int, high: int, names: tuple[str, ...], expression: str) -> None:
    match = _ITEM.match(item)
    if not match:
        raise ValueError(f"cron expression {expression!r}: {name} field {item!r} is not N, N-M, *, */S or N-M/S; e.g. {EXAMPLE}")
    span, step = match.group(1), match.group(2)
    if step is not None and int(step) == 0:
        raise ValueError(f"cron expression {expression!r}: {name} step must be at least 1, got {item!r}")
    if span == "*":
        return
    bounds = span.split("-")
    values = [_value(b, name, low, high, names, expression) for b in bounds]
    if len(values) == 2 and values[0] > values[1]:
        raise ValueError(f"cron expression {expression!r}: {name} range {span!r} runs backwards; write {bounds[1]}-{bounds[0]}")


def _value(token: str, name: str, low: int, high: int, names: tuple[str, ...], expression: str) -> int:
    if token in names:
        return names.index(token) + (1 if name == "month" else 0)
    if not token.isdigit():
        hint = f" or a name ({', '.join(names)})" if names else ""
        raise ValueError(f"cron expression {expression!r}: {name} {token!r} is not a number{hint}")
    value = int(token)
    if not low <= value <= high:
        raise ValueError(f"cron expression {expression!r}: {name} must be in {low}..{high}, got {value}")
    return value
