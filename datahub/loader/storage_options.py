"""The per-tier fsspec options the loader reads with: given raw, or built from the storage YAML the export used.

``storage=`` takes either ``{tier: fsspec options}`` or a ``datahub.storage.StorageConfig`` (or the path of a
storage YAML), so a trainer passes the same storage.yaml as ``datahub export``; credentials then come from the
environment variables or the credentials file each tier names, exactly as for the export.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from datahub.shards.manifest import Manifest

if TYPE_CHECKING:
    from datahub.storage.config import StorageConfig

TierOptions = dict[str, dict[str, Any]]
StorageArg = Union[Mapping[str, Mapping[str, Any]], "StorageConfig", str, os.PathLike[str], None]


def as_storage(storage: StorageArg) -> Mapping[str, Mapping[str, Any]] | StorageConfig | None:
    """Raw options stay as they are; a storage YAML path is loaded and validated (errors name the file and field)."""
    if storage is None or isinstance(storage, Mapping):
        return storage
    from datahub.storage.config import StorageConfig, load_storage_config

    if isinstance(storage, StorageConfig):
        return storage
    if isinstance(storage, (str, os.PathLike)):
        return load_storage_config(storage)
    raise TypeError(f"storage must be {{tier: fsspec options}}, a StorageConfig or a storage YAML path; "
                    f"got {type(storage).__name__}")


def tier_options(storage: Mapping[str, Mapping[str, Any]] | StorageConfig | None, *, tiers: Iterable[str]) -> TierOptions:
    """fsspec options per tier; from a StorageConfig only for ``tiers`` (the ones the loader may read), so a tier
    it never touches needs no credentials. Includes secrets: never log the result."""
    if storage is None:
        return {}
    if isinstance(storage, Mapping):
        return {tier: dict(options) for tier, options in storage.items()}
    return {name: storage.tier(name).reader_options() for name in dict.fromkeys(tiers) if name in storage.tiers}


def readable_tiers(manifest: Manifest, tier_preference: Sequence[str] | None) -> list[str]:
    """The tiers a loader may read: those holding a replica, in preference order when one is given."""
    held = {tier: None for shard in manifest.shards for tier in shard.replicas}
    return [tier for tier in tier_preference or held if tier in held]


def manifest_options(storage: Mapping[str, Mapping[str, Any]] | StorageConfig | None, uri: str) -> dict[str, Any]:
    """Options to open a manifest at ``uri`` on an object store: the tier whose root holds it (StorageConfig),
    else the first tier given non-empty raw options."""
    if storage is None or "://" not in uri or uri.startswith("file://"):
        return {}
    if isinstance(storage, Mapping):
        return next((dict(options) for options in storage.values() if options), {})
    for name in storage.tiers:
        tier = storage.tier(name)
        if uri.startswith(tier.root_uri.rstrip("/") + "/"):
            return tier.reader_options()
    return {}


def tier_list(tier_preference: str | Sequence[str] | None) -> list[str] | None:
    """``tier_preference`` as a list of tier names: one name given as a string is that tier alone (as a string it
    would otherwise be iterated as the tiers 'c', 'f', 's')."""
    if tier_preference is None:
        return None
    return [tier_preference] if isinstance(tier_preference, str) else list(tier_preference)
