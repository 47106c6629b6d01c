"""Storage tiers (cfs, ceph, hdfs): validated config, one Tier object per configured tier, placement policy.

A tier is reached through a URL plus options built from the storage YAML; nothing is read
from process-wide state except the credential environment variables a tier names.
"""

from datahub.storage.config import PolicySpec, StorageConfig, TierSpec, load_storage_config, validate_storage_config
from datahub.storage.policy import ReleaseState, desired_tiers, storage_class
from datahub.storage.tier import Tier

__all__ = [
    "PolicySpec",
    "ReleaseState",
    "StorageConfig",
    "Tier",
    "TierSpec",
    "desired_tiers",
    "load_storage_config",
    "storage_class",
    "validate_storage_config",
]
