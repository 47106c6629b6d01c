"""Cleaning operators: normalization that changes ``text``."""

from operators.clean import whitespace  # noqa: F401  (registration)
