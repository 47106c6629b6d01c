"""The storage YAML: tiers (cfs | ceph | hdfs) and the placement policy, validated with pydantic.

Errors name the file and field, e.g. ``storage.yaml: tiers.ceph.bucket: Field required``.
Credentials never appear in this config's values: a ceph tier names the environment
variables or the credentials file to read them from (see ``schemas/storage.example.yaml``).
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from datahub.config.spec import format_validation_error
from datahub.config.yaml_file import read_yaml
from datahub.errors import SpecError
from datahub.storage.tier import Tier
from datahub.storage.tier_spec import CephTier, CfsTier, HdfsTier, S3Credentials, TierSpec

__all__ = ["CephTier", "CfsTier", "HdfsTier", "PolicySpec", "S3Credentials", "StorageConfig", "TierSpec",
           "load_storage_config", "validate_storage_config"]

_TIER_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)



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

    def tier(self, name: str) -> Tier:
        """The ``Tier`` for a configured tier name (``Tier.from_config``)."""
        return Tier.from_config(self, name)

    def merged(self, other: StorageConfig) -> StorageConfig:
        """This config plus another's tiers (a second region); tier names must not clash."""
        clash = sorted(set(self.tiers) & set(other.tiers))
        if clash:
            raise SpecError(f"{other.source}: tiers {clash} are also defined in {self.source}; rename them (e.g. ceph-eu)")
        return StorageConfig(tiers={**self.tiers, **other.tiers}, policy=self.policy, source=self.source)


def validate_storage_config(raw: dict[str, Any], *, source: str = "<storage>") -> StorageConfig:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping with 'tiers' (and optionally 'policy'), got {type(raw).__name__}")
    job_spec = any(key in raw for key in ("lake", "inputs", "graph"))
    if "tiers" not in raw and (job_spec or "root" in raw):  # --lake and --storage both take a YAML: an easy mix-up
        what = "a job spec (lake:, graph:; --lake takes its lake: section)" if job_spec else "a lake YAML (root:)"
        raise SpecError(f"{source}: {what}, not a storage config; give it as --lake, and the tiers as --storage "
                        "STORAGE.yaml (tiers:, see schemas/storage.example.yaml)")
    try:
        return StorageConfig(**raw, source=source)
    except ValidationError as exc:
        raise SpecError(format_validation_error(source, _in_yaml_terms(exc))) from None


def _in_yaml_terms(error: ValidationError) -> ValidationError:
    """The error with the YAML's field paths: pydantic puts a tagged union's tag, the tier's kind, into the path
    (``tiers.c.ceph.endpoint_url`` for the YAML's ``tiers.c.endpoint_url``)."""
    kinds = {get_args(model.model_fields["kind"].annotation)[0] for model in (CfsTier, CephTier, HdfsTier)}
    items = []
    for item in error.errors(include_url=False):
        loc, ctx = item["loc"], item.get("ctx", {})
        kind: str | PydanticCustomError = item["type"]
        if len(loc) > 2 and loc[0] == "tiers" and loc[2] in kinds:
            loc = loc[:2] + loc[3:]
        elif item["type"] in ("union_tag_not_found", "union_tag_invalid"):  # pydantic's "Unable to extract tag
            # using discriminator 'kind'" and "Input tag 'nfs' found using 'kind' does not match any of ..."
            loc, ctx = loc + ("kind",), {"tag": repr(ctx.get("tag")), "kinds": ", ".join(sorted(kinds))}
            kind = (PydanticCustomError("kind_missing", "required field is missing; add it: one of {kinds}", ctx)
                    if item["type"] == "union_tag_not_found" else
                    PydanticCustomError("kind_unknown", "{tag} is not a tier kind; use one of {kinds}", ctx))
        items.append(InitErrorDetails(type=kind, loc=loc, input=item["input"], ctx=ctx))
    return ValidationError.from_exception_data(error.title, items)


def load_storage_config(path: str | os.PathLike[str]) -> StorageConfig:
    """Read and validate a storage YAML (see schemas/storage.example.yaml)."""
    raw = read_yaml(path, missing="storage config not found; pass --storage PATH (see schemas/storage.example.yaml)")
    return validate_storage_config(raw, source=os.fspath(path))
