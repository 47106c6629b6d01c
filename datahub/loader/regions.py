"""Replica order by region: a reader tries the tiers of its own region first and fails over to the others.

A tier's region is the ``region:`` label of its entry in the storage YAML (``datahub.storage.tier_spec``). The
reader's region is ``ReleaseDataset(region=...)`` or ``PackedDataset(region=...)``, else the ``DATAHUB_REGION``
environment variable (read in ``datahub.settings``); with neither, or raw ``{tier: fsspec options}`` (no labels), the
order is the manifest's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from datahub import settings

if TYPE_CHECKING:
    from datahub.storage.config import StorageConfig


def reader_region(region: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The reader's region: ``region`` when given, else ``DATAHUB_REGION`` (empty: none)."""
    if region is not None:
        return region or None
    return settings.region(environ)


def tier_regions(storage: Mapping[str, Mapping[str, Any]] | StorageConfig | None) -> dict[str, str | None]:
    """Each configured tier's region label; empty for raw fsspec options, which carry none."""
    if storage is None or isinstance(storage, Mapping):
        return {}
    return {name: spec.region for name, spec in storage.tiers.items()}


def region_order(tiers: Sequence[str], regions: Mapping[str, str | None], region: str | None) -> list[str]:
    """``tiers`` with those labelled ``region`` first; each group keeps its order (the failover order after them)."""
    if region is None:
        return list(tiers)
    return sorted(tiers, key=lambda tier: regions.get(tier) != region)  # stable: False (own region) sorts first


def region_preference(tiers: Sequence[str], storage: Mapping[str, Mapping[str, Any]] | StorageConfig | None,
                      region: str | None) -> list[str] | None:
    """A tier preference for a reader in ``region`` (or ``DATAHUB_REGION``): the tiers holding replicas, its own
    region's first; None (the manifest's order) when the reader has no region or no tier is labelled."""
    own, regions = reader_region(region), tier_regions(storage)
    if own is None or not any(regions.values()):
        return None
    return region_order(tiers, regions, own)
