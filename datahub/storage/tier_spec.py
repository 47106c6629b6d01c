"""The tier models of the storage YAML (cfs | ceph | hdfs): what ``Tier`` is built from."""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# every tier kind: where the tier is, for readers that prefer a replica in their own region (DATAHUB_REGION)
_REGION_HELP = ("region label, e.g. eu-west: the loader prefers replicas in its own region (DATAHUB_REGION) and "
                "fails over to the others; unset: no region")


class CfsTier(_Model):
    """A POSIX mount (Tencent CFS is NFS or CFS Turbo): publish by write-to-temp then rename."""

    kind: Literal["cfs"]
    path: str = Field(..., description="directory on the mount, e.g. /mnt/cfs/releases (relative: from the current directory)")
    region: str | None = Field(None, description=_REGION_HELP)
    direct_io: Literal["auto", "on", "off"] = Field(
        "auto", description="write large objects (shards) with O_DIRECT, past the page cache: auto (default) on a "
        "local block-device filesystem (ext4, xfs, btrfs, ...) that accepts it, buffered on NFS/CFS, FUSE and tmpfs; on: an error where it refuses; off: always buffered (readers "
        "right after an export then find the shards in the page cache)")

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
    region: str | None = Field(None, description=_REGION_HELP + "; also the S3 region sent to the endpoint "
                               "(us-east-1 when unset), unless s3_region is given")
    s3_region: str | None = Field(None, description="the S3 region the endpoint expects when the region label differs "
                                  "(e.g. an RGW zonegroup's api_name)")
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
    region: str | None = Field(None, description=_REGION_HELP)
    # fsspec's WebHDFS client has no timeout of its own: a NameNode or DataNode that stops answering would block
    connect_timeout_s: float = Field(10.0, gt=0, description="seconds to connect to the NameNode or a DataNode")
    read_timeout_s: float = Field(120.0, gt=0, description="seconds to wait for any answer (between bytes read)")

    @field_validator("url")
    @classmethod
    def _webhdfs(cls, value: str) -> str:
        if not re.match(r"^webhdfs://[^/:]+:\d+/", value):
            raise ValueError(f"must look like webhdfs://HOST:PORT/path, got {value!r}")
        return value.rstrip("/")


TierSpec = Annotated[CfsTier | CephTier | HdfsTier, Field(discriminator="kind")]
