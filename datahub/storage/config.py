"""The storage YAML: tiers (cfs | ceph | hdfs) and the placement policy, validated with pydantic.

Errors name the file and field, e.g. ``storage.yaml: tiers.ceph.bucket: Field required``.
Credentials never appear in this config's values: a ceph tier names the environment
variables or the credentials file to read them from (see ``schemas/storage.example.yaml``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from datahub.config.spec import format_validation_error
from datahub.errors import SpecError

_TIER_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CfsTier(_Model):
    """A POSIX mount (Tencent CFS is NFS or CFS Turbo): publish by write-to-temp then rename."""

    kind: Literal["cfs"]
    path: str = Field(..., description="directory on the mount, e.g. /mnt/cfs/releases (relative: from the current directory)")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        # a relative path resolves against the current directory, like job spec paths
        return os.path.abspath(os.path.expanduser(value))


class S3Credentials(_Model):
    """Where the access key comes from: environment variables (default) or a credentials file."""

    key_env: str = "AWS_ACCESS_KEY_ID"
    secret_env: str = "AWS_SECRET_ACCESS_KEY"
    file: str | None = Field(None, description="a file with access_key_id/secret_access_key lines (KEY=value or YAML)")


class CephTier(_Model):
    """A Ceph RGW (or any S3) bucket, reached with s3fs."""

    kind: Literal["ceph"]
    endpoint_url: str = Field(..., description="e.g. http://rgw.internal:7480")
    bucket: str
    prefix: str = ""
    region: str = "us-east-1"
    credentials: S3Credentials = Field(default_factory=S3Credentials)

    @field_validator("endpoint_url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


class HdfsTier(_Model):
    """HDFS through WebHDFS (fsspec ``webhdfs``): ``url: webhdfs://namenode:9870/datahub/releases``."""

    kind: Literal["hdfs"]
    url: str = Field(..., description="webhdfs://HOST:PORT/absolute/path")
    user: str | None = None

    @field_validator("url")
    @classmethod
    def _webhdfs(cls, value: str) -> str:
        if not re.match(r"^webhdfs://[^/:]+:\d+/", value):
            raise ValueError(f"must look like webhdfs://HOST:PORT/path, got {value!r}")
        return value.rstrip("/")


TierSpec = Annotated[CfsTier | CephTier | HdfsTier, Field(discriminator="kind")]

StorageClass = Literal["hot", "warm", "cold"]


class PolicySpec(_Model):
    """Which storage class a release belongs to, and the tiers (replicas) each class keeps.

    hot: channel in ``hot_channels`` or read within ``hot_if_read_within_days``;
    cold: archived, or unread for ``cold_if_unread_days``; warm: everything else.
    """

    classes: dict[StorageClass, list[str]] = Field(default_factory=dict, description="class -> tiers holding a replica")
    hot_channels: list[str] = Field(default_factory=lambda: ["stable"])
    hot_if_read_within_days: int | None = Field(14, ge=0)
    cold_if_unread_days: int | None = Field(None, ge=1)

    @field_validator("classes")
    @classmethod
    def _non_empty(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, tiers in value.items():
            if not tiers:
                raise ValueError(f"class {name!r} lists no tiers; give at least one (every release keeps a replica)")
            if len(set(tiers)) != len(tiers):
                raise ValueError(f"class {name!r} lists a tier twice: {tiers}")
        return value


class StorageConfig(_Model):
    tiers: dict[str, TierSpec]
    policy: PolicySpec = Field(default_factory=PolicySpec)
    source: str = Field("<storage>", exclude=True, description="where this config came from (for messages)")

    @field_validator("tiers")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            raise ValueError("configure at least one tier")
        for name in value:
            if not _TIER_NAME.match(name):
                raise ValueError(f"tier name {name!r} must match [a-z][a-z0-9_-]*")
        return value

    @model_validator(mode="after")
    def _policy_tiers_exist(self) -> StorageConfig:
        for name, tiers in self.policy.classes.items():
            unknown = [t for t in tiers if t not in self.tiers]
            if unknown:
                raise ValueError(f"policy.classes.{name} names unknown tiers {unknown}; configured: {sorted(self.tiers)}")
        return self

    def tier(self, name: str) -> Any:
        """The ``datahub.storage.Tier`` for a configured tier name."""
        from datahub.storage.tier import Tier

        if name not in self.tiers:
            raise SpecError(f"{self.source}: tiers.{name}: no such tier; configured tiers: {sorted(self.tiers)}")
        return Tier(name, self.tiers[name], source=self.source)

    def merged(self, other: StorageConfig) -> StorageConfig:
        """This config plus another's tiers (a second region); tier names must not clash."""
        clash = sorted(set(self.tiers) & set(other.tiers))
        if clash:
            raise SpecError(f"{other.source}: tiers {clash} are also defined in {self.source}; rename them (e.g. ceph-eu)")
        return StorageConfig(tiers={**self.tiers, **other.tiers}, policy=self.policy, source=self.source)


def validate_storage_config(raw: dict[str, Any], *, source: str = "<storage>") -> StorageConfig:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping with 'tiers' (and optionally 'policy'), got {type(raw).__name__}")
    try:
        return StorageConfig(**raw, source=source)
    except ValidationError as exc:
        raise SpecError(format_validation_error(source, exc)) from None


def load_storage_config(path: str | os.PathLike[str]) -> StorageConfig:
    """Read and validate a storage YAML (see schemas/storage.example.yaml)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: storage config not found; pass --storage PATH (see schemas/storage.example.yaml)") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    return validate_storage_config(raw, source=str(path))
