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
    last_read: datetime | None = None  # latest recorded read (datahub.release.events)
    archived: bool = False
    created: datetime | None = None  # when it was released (or exported): "unread" counts from here


def storage_class(state: ReleaseState, policy: PolicySpec, *, now: datetime | None = None) -> StorageClass:
    """archived -> cold; stable channel or recently read -> hot; long unread -> cold; else warm.

    "Unread for N days" counts from the last read, or from ``created`` for a release never read
    (a fresh release is not cold on day one); with neither known it counts as unread for ever.
    """
    return storage_class_rule(state, policy, now=now)[0]


def storage_class_rule(state: ReleaseState, policy: PolicySpec, *, now: datetime | None = None) -> tuple[StorageClass, str]:
    """The storage class and the policy rule that chose it, in words (``datahub tier plan`` shows it)."""
    now = now or datetime.now(timezone.utc)
    if state.archived:
        return "cold", "archived"
    hot_channels = sorted(set(state.channels) & set(policy.hot_channels))
    if hot_channels:
        return "hot", f"channel {', '.join(hot_channels)} (policy.hot_channels)"
    if (state.last_read is not None and policy.hot_if_read_within_days is not None
            and now - state.last_read <= timedelta(days=policy.hot_if_read_within_days)):
        return "hot", f"read {(now - state.last_read).days} days ago (policy.hot_if_read_within_days: {policy.hot_if_read_within_days})"
    since = state.last_read if state.last_read is not None else state.created
    if policy.cold_if_unread_days is not None and (since is None or now - since > timedelta(days=policy.cold_if_unread_days)):
        unread = "never read" if since is None else f"unread for {(now - since).days} days"
        return "cold", f"{unread} (policy.cold_if_unread_days: {policy.cold_if_unread_days})"
    return "warm", "no hot or cold rule applies (default warm)"


def desired_tiers(state: ReleaseState, policy: PolicySpec, *, now: datetime | None = None) -> list[str] | None:
    """The tiers that should hold a replica, or None when the policy has no entry for the class (leave as is)."""
    tiers = policy.classes.get(storage_class(state, policy, now=now))
    return list(tiers) if tiers else None
