"""``release.channels``: movable pointers (``stable``, ``canary``) with a kept history.

Each promote or rollback appends one event; the pointer is the replay of the history as a
stack (promote pushes, rollback pops), so rollback returns to the previous pointer. Event
``seq`` numbers are part of the commit txn: two writers racing on one channel cannot both win.
"""

from __future__ import annotations

import getpass
from datetime import datetime, timezone

import pyarrow as pa

from datahub.errors import ReleaseError
from datahub.lake.lake import Lake
from datahub.release.records import (CHANNELS, CHANNELS_TABLE, ChannelEvent, Release, channel_history, channel_pointers,
                                     channel_stacks, check_name, get_release)

__all__ = ["ChannelEvent", "channel_history", "channel_of", "channel_pointers", "promote", "rollback"]


def channel_of(lake: Lake, channel: str) -> Release | None:
    """The release ``channel`` points at, or None when it was never promoted."""
    name = channel_pointers(lake).get(channel)
    return None if name is None else get_release(lake, name)


def _append(lake: Lake, channel: str, action: str, release: str | None, actor: str | None) -> None:
    seq = len(channel_history(lake, channel)) + 1
    row = {"channel": channel, "seq": seq, "action": action, "release": release,
           "actor": actor or _actor(), "ts": datetime.now(timezone.utc)}
    committed = lake.commit(CHANNELS_TABLE, pa.Table.from_pylist([row], CHANNELS), txn=f"channel/{channel}/{seq}")
    if committed is None:
        raise ReleaseError(f"channel {channel!r} was moved by another writer at the same time; check "
                           f"`datahub release show` and retry")


def promote(lake: Lake, name: str, *, channel: str, actor: str | None = None) -> Release:
    """Point ``channel`` at release ``name`` (the release itself never changes)."""
    check_name(channel, what="channel name")
    release = get_release(lake, name)  # refuses unknown releases
    if channel_pointers(lake).get(channel) == name:
        return release
    _append(lake, channel, "promote", name, actor)
    return get_release(lake, name)


def rollback(lake: Lake, *, channel: str, actor: str | None = None) -> Release | None:
    """Move ``channel`` back to the release it pointed at before its last promote."""
    stack = channel_stacks(channel_history(lake, channel)).get(channel, [])
    if len(stack) < 2:
        where = "was never promoted" if not stack else f"has no earlier release than {stack[-1]!r}"
        raise ReleaseError(f"cannot roll back channel {channel!r}: it {where}")
    _append(lake, channel, "rollback", stack[-2], actor)
    return get_release(lake, stack[-2])


def _actor() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return "unknown"
