"""The real Ceph S3 endpoint (radosgw on 127.0.0.1) that tests run against, started by .ci/ceph.sh.

Import the fixture where it is needed: ``from tests.ceph import ceph_s3  # noqa: F401``.
This module is the one place that reads the DATAHUB_TEST_S3_* and DATAHUB_CEPH_DIR variables.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[1]
CEPH_SCRIPT = REPO / ".ci" / "ceph.sh"
DEFAULT_STATE_DIR = "/tmp/datahub-ceph"
ENV_NAMES = ("DATAHUB_TEST_S3_ENDPOINT", "DATAHUB_TEST_S3_KEY", "DATAHUB_TEST_S3_SECRET", "DATAHUB_TEST_S3_REGION")
# A cold start takes about 15 s here; apt-get on a fresh machine adds about 30 s more.
START_TIMEOUT_S = 300


@dataclass(frozen=True)
class S3Endpoint:
    """Where the test S3 endpoint is and how to log in to it."""

    endpoint_url: str
    key: str
    secret: str
    region: str = "us-east-1"

    def storage_options(self) -> dict[str, str]:
        """delta-rs storage options; conditional put by ETag makes commits safe without a lock table."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
            "aws_conditional_put": "etag",
        }

    def s3fs_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``s3fs.S3FileSystem``."""
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region},
        }

    def filesystem(self, **extra: Any) -> Any:
        """A fresh (uncached) s3fs filesystem on this endpoint."""
        import s3fs

        return s3fs.S3FileSystem(**self.s3fs_kwargs(), skip_instance_cache=True, **extra)

    def new_bucket(self, prefix: str) -> str:
        """Create a bucket with a unique name starting with ``prefix`` and return its name."""
        stem = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")[:40] or "test"
        name = f"{stem}-{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(name)
        return name


def _state_dir() -> Path:
    return Path(os.environ.get("DATAHUB_CEPH_DIR") or DEFAULT_STATE_DIR)


def _from_environment() -> S3Endpoint | None:
    if not os.environ.get("DATAHUB_TEST_S3_ENDPOINT"):
        return None
    missing = [name for name in ENV_NAMES[1:3] if not os.environ.get(name)]
    if missing:
        raise RuntimeError(f"DATAHUB_TEST_S3_ENDPOINT is set but {', '.join(missing)} is not")
    return S3Endpoint(
        endpoint_url=os.environ["DATAHUB_TEST_S3_ENDPOINT"],
        key=os.environ["DATAHUB_TEST_S3_KEY"],
        secret=os.environ["DATAHUB_TEST_S3_SECRET"],
        region=os.environ.get("DATAHUB_TEST_S3_REGION") or "us-east-1",
    )


def _from_env_file(path: Path) -> S3Endpoint | None:
    """Parse the KEY=value lines .ci/ceph.sh writes; None when the file is absent or incomplete."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    values = dict(line.split("=", 1) for line in lines if "=" in line and not line.lstrip().startswith("#"))
    values = {name.strip(): value.strip() for name, value in values.items()}
    if not all(values.get(name) for name in ENV_NAMES[:3]):
        return None
    return S3Endpoint(
        endpoint_url=values["DATAHUB_TEST_S3_ENDPOINT"],
        key=values["DATAHUB_TEST_S3_KEY"],
        secret=values["DATAHUB_TEST_S3_SECRET"],
        region=values.get("DATAHUB_TEST_S3_REGION") or "us-east-1",
    )


def _answers(endpoint_url: str, timeout_s: float = 2.0) -> bool:
    """True when something accepts TCP connections at the endpoint's host and port."""
    parts = urlsplit(endpoint_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def run_ceph_script(command: str, *, timeout_s: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run ``bash .ci/ceph.sh COMMAND``; raise RuntimeError with its output when it fails."""
    try:
        result = subprocess.run(
            ["bash", str(CEPH_SCRIPT), command], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"bash {CEPH_SCRIPT} {command} did not finish in {timeout_s:.0f} s") from error
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-4000:]
        raise RuntimeError(f"bash {CEPH_SCRIPT} {command} exited {result.returncode}:\n{output}")
    return result


def _discover() -> tuple[S3Endpoint | None, str]:
    """The endpoint, or None and the reason there is none."""
    endpoint = _from_environment()
    if endpoint is not None:
        return endpoint, ""
    env_file = _state_dir() / "s3.env"
    endpoint = _from_env_file(env_file)
    if endpoint is not None and _answers(endpoint.endpoint_url):
        return endpoint, ""
    if shutil.which("radosgw") is None:
        return None, (
            "no Ceph S3 endpoint: DATAHUB_TEST_S3_ENDPOINT is unset, "
            f"{env_file} is missing and radosgw is not installed; run: sudo bash .ci/ceph.sh start"
        )
    if os.geteuid() != 0:
        return None, f"no Ceph S3 endpoint and starting one needs root; run: sudo bash {CEPH_SCRIPT} start"
    try:
        run_ceph_script("start")
    except RuntimeError as error:
        return None, f"could not start Ceph: {error}"
    endpoint = _from_env_file(env_file)
    if endpoint is None:
        return None, f"bash {CEPH_SCRIPT} start succeeded but wrote no complete {env_file}"
    return endpoint, ""


def ceph_s3_config() -> S3Endpoint | None:
    """The test S3 endpoint from DATAHUB_TEST_S3_*, else $DATAHUB_CEPH_DIR/s3.env, else a cluster we start.

    None when there is none and we cannot start one (no radosgw binary, not root, or the start failed).
    """
    return _discover()[0]


@pytest.fixture(scope="session")
def ceph_s3() -> S3Endpoint:
    """The Ceph S3 endpoint; fails under CI (where Ceph must be there), skips elsewhere."""
    endpoint, reason = _discover()
    if endpoint is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but Ceph S3 is unavailable: {reason}", pytrace=False)
        pytest.skip(reason)
    return endpoint


def stop_rgw() -> None:
    """Stop radosgw only: the S3 endpoint goes away while the cluster keeps its data."""
    run_ceph_script("stop-rgw", timeout_s=60)


def start_rgw() -> None:
    """Start radosgw again and return once it answers S3 requests."""
    run_ceph_script("start-rgw")


def restart_rgw() -> None:
    """Stop and start radosgw, as a Ceph restart during a run looks to a client."""
    stop_rgw()
    start_rgw()
