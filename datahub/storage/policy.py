"""Placement policy: a release's storage class (hot | warm | cold) and the tiers that class keeps.

The inputs are plain values (``ReleaseState``), so the policy is a pure function that tests
call directly; ``datahub tier`` fills them from the release module and the manifests.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from datahub.storage.config import PolicySpec, StorageClass


@dataclass(frozen=True)
class ReleaseState:
    """What the policy looks at: the release's channel, when it was last read, whether it is archived."""

    name: str
    channels: tuple[str, ...] = ()  # channels pointing at the release now (stable, canary, ...)
    last_read: datetime | None = None
    archived: bool = False


def storage_class(state: ReleaseState, policy: PolicySpec, *, now: datetime | None = None) -> StorageClass:
    """archived -> cold; stable channel or recently read -> hot; long unread -> cold; else warm."""
    now = now or datetime.now(timezone.utc)
    if state.archived:
        return "cold"
    if set(state.channels) & set(policy.hot_channels):
        return "hot"
    age = now - state.last_read if state.last_read is not None else None
    if age is not None and policy.hot_if_read_within_days is not None and age <= timedelta(days=policy.hot_if_read_within_days):
        return "hot"
    if policy.cold_if_unread_days is not None and (age is None or age > timedelta(days=policy.cold_if_unread_days)):
        return "cold"
    return "warm"


def desired_tiers(state: ReleaseState, policy: PolicySpec, *, now: datetime | None = None) -> list[str] | None:
    """The tiers that should hold a replica, or None when the policy has no entry for the class (leave as is)."""
    tiers = policy.classes.get(storage_class(state, policy, now=now))
    return list(tiers) if tiers else None
