"""Errors of the loader; they extend datahub.errors so retry decisions follow the class."""

from __future__ import annotations

from datahub.errors import SpecError, StorageError


class NoReadableReplicaError(StorageError):
    """Every tier of a shard was tried and none gave bytes matching the manifest."""


class ManifestError(SpecError):
    """A release manifest is missing, unreadable or lacks a field the loader needs."""
