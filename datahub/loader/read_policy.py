"""How patiently the loader reads a replica from a remote tier: per-request timeouts, bounded retries, failover.

A request to an object store gets ``connect_timeout_s`` to connect and ``read_timeout_s`` per socket read, so a
frozen server (accepting connections, answering nothing) costs at most one read timeout, and a dead one (connection
refused) costs nothing. The transport's own retries are turned off (botocore's ``total_max_attempts=1``, s3fs's
``retries=1``): retrying is the loader's job, so the time a shard can take is bounded by ``worst_case_s``.

A shard is read in rounds over its tiers (in ``tier_preference`` order): a tier that fails transiently is skipped
for ``tier_cooldown_s`` (tried last, not first, so every shard does not wait for a dead tier again), a tier with
a bad replica is not tried again for that shard, and after a round with no good replica the loader sleeps
``backoff_s * 2**round`` (capped, jittered) and tries the tiers that failed transiently again, ``attempts`` rounds
in all.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from datahub.errors import SpecError

_S3_PROTOCOLS = ("s3://", "s3a://")
# a fetch of an s3 object is at most two requests: HEAD (size) and GET (s3fs ``cat_file``)
_REQUESTS_PER_FETCH = 2


@dataclass(frozen=True)
class ReadPolicy:
    """Timeouts (seconds) and retry bounds for remote replica reads; the defaults suit a loaded object store."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    attempts: int = 3  # rounds over a shard's tiers
    backoff_s: float = 1.0
    max_backoff_s: float = 15.0
    tier_cooldown_s: float = 30.0  # a tier that did not answer is tried last for this long
    jitter: float = 0.1  # fraction of each sleep, so DataLoader workers do not retry in lockstep

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise SpecError(f"ReadPolicy.{name}: must be > 0 seconds, got {getattr(self, name)!r}")
        for name in ("backoff_s", "max_backoff_s", "tier_cooldown_s"):
            if not getattr(self, name) >= 0:
                raise SpecError(f"ReadPolicy.{name}: must be >= 0 seconds, got {getattr(self, name)!r}")
        if self.attempts < 1:
            raise SpecError(f"ReadPolicy.attempts: must be >= 1, got {self.attempts!r}")
        if not 0 <= self.jitter < 1:
            raise SpecError(f"ReadPolicy.jitter: must be in [0, 1), got {self.jitter!r}")

    def delay(self, attempt: int) -> float:
        """Sleep after round ``attempt`` (1-based) before the next one."""
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * (1 + random.uniform(-self.jitter, self.jitter))

    def worst_case_s(self, tiers: int) -> float:
        """An upper bound on the time one shard read can take before it returns or raises, over ``tiers`` remote
        tiers (local reads not counted): every round waits every tier's timeouts, plus the backoff sleeps."""
        per_round = tiers * _REQUESTS_PER_FETCH * (self.connect_timeout_s + self.read_timeout_s)
        sleeps = sum(min(self.max_backoff_s, self.backoff_s * 2 ** (a - 1)) for a in range(1, self.attempts))
        return self.attempts * per_round + sleeps * (1 + self.jitter)

    def fsspec_options(self, uri: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` for the filesystem of ``uri`` with this policy's timeouts; the transport's own retries off.

        Settings the caller gave in ``config_kwargs`` win. An own instance (not fsspec's shared cache), since the
        loader changes its retry count.
        """
        merged = dict(options)
        if not uri.startswith(_S3_PROTOCOLS):
            return merged
        config = {"connect_timeout": self.connect_timeout_s, "read_timeout": self.read_timeout_s,
                  "retries": {"total_max_attempts": 1}}
        merged["config_kwargs"] = {**config, **dict(merged.get("config_kwargs") or {})}
        merged["skip_instance_cache"] = True
        return merged


def limit_transport_retries(filesystem: Any) -> None:
    """s3fs retries timeouts itself (``retries`` tries, about 2 s of sleeps for 5): one try, the loader retries."""
    if hasattr(filesystem, "retries") and type(filesystem).__module__.startswith("s3fs"):
        filesystem.retries = 1


DEFAULT_READ_POLICY = ReadPolicy()
