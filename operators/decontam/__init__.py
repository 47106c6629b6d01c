"""Decontamination against registered evaluation sets. Importing registers ``decontaminate``."""

from operators.decontam import op  # noqa: F401  (registration)
