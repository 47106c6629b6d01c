"""WebDataset export: deterministic ustar shards + an atomically published manifest, on a storage tier."""

from datahub.export.export import export_release, export_table_version, parse_size, shard_name
from datahub.shards.manifest import Manifest, ShardRecord, read_lake_manifest

__all__ = ["Manifest", "ShardRecord", "export_release", "export_table_version", "parse_size", "read_lake_manifest",
           "shard_name"]
