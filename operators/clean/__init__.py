"""Cleaning operators: normalization that changes ``text``."""

from operators.clean import boilerplate, unicode_fix, whitespace  # noqa: F401  (registration)
