"""The "did you mean" part of an error about a name that does not exist (a typo of a release, an export, an
operator): the known names closest to it, by ``difflib``'s ratio."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'a', 'b'?"`` with up to three of ``known`` close to ``name``, or ``""`` when none is."""
    close = difflib.get_close_matches(name, list(known), n=3)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""
