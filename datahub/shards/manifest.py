"""The export manifest (schemas/manifest.v1.json): what a trainer needs to find and check every shard.

One model for the writer (``datahub.export``, strict: every field) and the reader (``datahub.loader``, lenient:
manifests of other writers may lack ``created``, ``table_version`` or a shard's ``sha256``).

Published last and atomically, in the export directory of each tier holding a replica and
under ``{lake}/_exports/{release}/manifest.json`` (where ``datahub.loader`` resolves release
names), so a crashed export or tier move never shows a half-written manifest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from datahub.errors import IntegrityError, LakeError
from datahub.lake.lake import Lake, fsspec_options
from datahub.storage.tier import Tier, _publish_posix

MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class ShardRecord:
    name: str
    size: int
    sha256: str | None  # None only in manifests of other writers (the loader then checks the size alone)
    samples: int
    replicas: dict[str, str] = field(default_factory=dict)  # tier -> URI (a plain path on cfs)

    @property
    def checksum(self) -> str:
        """The sha256, which datahub's own manifests always carry (copies and repairs need it)."""
        if self.sha256 is None:
            raise IntegrityError(f"{self.name}: the manifest gives no sha256, so its replicas cannot be verified; "
                                 "re-export the release with datahub")
        return self.sha256


@dataclass(frozen=True)
class Manifest:
    release: str
    release_digest: str
    num_samples: int
    shards: tuple[ShardRecord, ...]
    created: str = ""
    table: str = ""
    table_version: int = -1
    shuffle_seed: int | None = None
    export: dict[str, Any] = field(default_factory=dict)  # export_key and shard settings (resume identity)
    manifest_version: int = MANIFEST_VERSION

    @property
    def tiers(self) -> list[str]:
        """Tiers that hold a replica of every shard."""
        if not self.shards:
            return sorted(self.export.get("tiers", []))
        common = set(self.shards[0].replicas)
        for shard in self.shards[1:]:
            common &= set(shard.replicas)
        return sorted(common)

    @property
    def shard_pattern(self) -> str:
        """Brace-expandable shard names, e.g. ``demo-v1-{000000..000009}.tar`` (webdataset, bash)."""
        last = max(len(self.shards) - 1, 0)
        return f"{self.release}-{{{0:06d}..{last:06d}}}.tar"

    def with_replicas(self, replicas: dict[str, dict[str, str]]) -> Manifest:
        """A copy whose shard ``name`` has ``replicas[name]`` as its replica map."""
        shards = tuple(replace(s, replicas=dict(replicas.get(s.name, s.replicas))) for s in self.shards)
        return replace(self, shards=shards)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shards"] = [asdict(s) for s in self.shards]
        data["shard_pattern"] = self.shard_pattern
        order = ["manifest_version", "release", "created", "table", "table_version", "release_digest",
                 "num_samples", "shuffle_seed", "shard_pattern", "export", "shards"]
        return {key: data[key] for key in order}

    def to_json(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n").encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "manifest", strict: bool = True) -> Manifest:
        """Parse a manifest. ``strict`` (the exporter's own manifests): every field of the schema; otherwise
        only what a reader needs (release, shards with name, size, samples and replicas)."""
        try:
            if strict and int(data["manifest_version"]) != MANIFEST_VERSION:
                raise IntegrityError(f"{where}: manifest_version {data['manifest_version']} is not supported "
                                     f"(this datahub reads {MANIFEST_VERSION}); upgrade datahub")
            shards = tuple(ShardRecord(name=str(s["name"]), size=int(s["size"]),
                                       sha256=s["sha256"] if strict else s.get("sha256"), samples=int(s["samples"]),
                                       replicas={str(t): str(u) for t, u in s["replicas"].items()})
                           for s in data["shards"])
            total = sum(s.samples for s in shards)
            release = str(data["release"])
            manifest = cls(release=release, created=data["created"] if strict else str(data.get("created", "")),
                           table=str(data.get("table", "")),
                           table_version=int(data["table_version"] if strict else data.get("table_version", -1)),
                           release_digest=str(data["release_digest"] if strict else data.get("release_digest") or release),
                           num_samples=int(data["num_samples"]) if strict or "num_samples" in data else total,
                           shuffle_seed=data.get("shuffle_seed"), shards=shards, export=dict(data.get("export") or {}))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IntegrityError(f"{where}: malformed manifest, missing or bad field ({type(exc).__name__}: {exc}); "
                                 "re-run datahub export") from None
        if total != manifest.num_samples:
            raise IntegrityError(f"{where}: num_samples is {manifest.num_samples} but the shards hold {total}; "
                                 "re-export the release")
        return manifest


def lake_manifest_uri(lake: Lake, release: str) -> str:
    return f"{lake.root}/_exports/{release}/{MANIFEST_NAME}"


def read_lake_manifest(lake: Lake, release: str) -> Manifest | None:
    """The manifest of ``release`` recorded in the lake, or None when it was never exported."""
    import fsspec

    uri = lake_manifest_uri(lake, release)
    fs, path = fsspec.core.url_to_fs(uri, **fsspec_options(lake.storage_options))
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LakeError(f"{uri}: cannot read the export manifest: {exc}") from exc
    return Manifest.from_dict(json.loads(data), where=uri)


def publish_lake_manifest(lake: Lake, manifest: Manifest) -> str:
    """Write the manifest under the lake root atomically (rename on POSIX, one PUT on S3)."""
    import fsspec

    uri = lake_manifest_uri(lake, manifest.release)
    if lake.is_local:
        from pathlib import Path

        _publish_posix(Path(uri.removeprefix("file://")), manifest.to_json())
        return uri
    fs, path = fsspec.core.url_to_fs(uri, **fsspec_options(lake.storage_options))
    fs.pipe_file(path, manifest.to_json())
    fs.invalidate_cache(path.rsplit("/", 1)[0])
    return uri


def read_tier_manifest(tier: Tier, release: str) -> Manifest | None:
    uri = tier.uri(release, MANIFEST_NAME)
    try:
        data = tier.read(uri)
    except FileNotFoundError:
        return None
    return Manifest.from_dict(json.loads(data), where=uri)
