"""The ``releases`` and ``release_channels`` tables: schemas, reading, the Release record.

A release is one append-only row in ``releases``: a name frozen to a (table, Delta version).
Channels (``stable``, ``canary``) are movable pointers kept as an event history in
``release_channels``; releases never move.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.close_names import did_you_mean
from datahub.errors import ReleaseError
from datahub.lake.lake import Lake
from datahub.lake.timestamps import iso_utc

RELEASES_TABLE = "releases"
CHANNELS_TABLE = "release_channels"
# Rows of a merged or redacted release are materialized here, one Delta table per release.
MATERIALIZED_PREFIX = "release_"

RELEASES = pa.schema(
    [
        ("name", pa.string()),
        ("table", pa.string()),
        ("table_version", pa.int64()),
        ("row_count", pa.int64()),
        ("digest", pa.string()),
        ("creator", pa.string()),
        ("created", pa.timestamp("us", tz="UTC")),
        ("kind", pa.string()),  # create | merge | redact
        ("parents", pa.list_(pa.string())),  # input releases of a merge / redact
        ("run_ids", pa.list_(pa.string())),  # pipeline runs whose commits the frozen version holds
        ("jobs", pa.list_(pa.string())),
        ("schema_version", pa.string()),
        ("qa_status", pa.string()),  # passed | no_qa_results
        ("details", pa.string()),  # JSON: weights, dedup, redaction reason, removed ids count ...
    ]
)

# Samples taken down by ``release redact``, one commit per redact release (txn ``release/{name}``); its record keeps
# the count (``details["removed"]``) and this table's name (``details["removed_ids_table"]``). Records written
# before it hold the ids inline (``details["removed_ids"]``, a list).
REDACTED_TABLE = "redacted_samples"
REDACTED = pa.schema([("sample_id", pa.string()), ("release", pa.string())])

CHANNELS = pa.schema(
    [
        ("channel", pa.string()),
        ("seq", pa.int64()),  # 1, 2, ... per channel; part of the commit txn, so racing writers conflict
        ("action", pa.string()),  # promote | rollback
        ("release", pa.string()),  # the release the channel points at after this event
        ("actor", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_name(name: str, *, what: str = "release name") -> str:
    if not _NAME.match(name or ""):
        why = " (it names a Delta table directory for merged and redacted releases)" if what == "release name" else ""
        raise ReleaseError(f"{what} {name!r}: use 1-128 letters, digits, '_', '.' or '-', starting with a letter or "
                           f"digit{why}")
    return name


@dataclass(frozen=True)
class Release:
    """A frozen dataset version: read it with ``lake.read(r.table, version=r.version)``."""

    name: str
    table: str
    version: int
    row_count: int
    digest: str
    created: datetime
    creator: str
    kind: str
    parents: tuple[str, ...]
    run_ids: tuple[str, ...]
    jobs: tuple[str, ...]
    schema_version: str | None
    qa_status: str
    details: dict[str, Any]
    channels: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["created"] = iso_utc(self.created)  # every --json date-time: ISO 8601 UTC with Z
        for key in ("parents", "run_ids", "jobs", "channels"):
            out[key] = list(out[key])
        return out


def read_release_rows(lake: Lake) -> pa.Table:
    if not lake.exists(RELEASES_TABLE):
        return RELEASES.empty_table()
    return lake.read(RELEASES_TABLE).sort_by([("created", "ascending")])


def release_from_row(row: dict[str, Any], channels: tuple[str, ...] = ()) -> Release:
    return Release(
        name=row["name"],
        table=row["table"],
        version=int(row["table_version"]),
        row_count=int(row["row_count"]),
        digest=row["digest"],
        created=row["created"],
        creator=row["creator"],
        kind=row["kind"],
        parents=tuple(row["parents"] or ()),
        run_ids=tuple(row["run_ids"] or ()),
        jobs=tuple(row["jobs"] or ()),
        schema_version=row["schema_version"],
        qa_status=row["qa_status"],
        details=json.loads(row["details"] or "{}"),
        channels=channels,
    )


def release_exists(lake: Lake, name: str) -> bool:
    rows = read_release_rows(lake)
    return bool(rows.num_rows) and bool(pc.any(pc.equal(rows.column("name"), name)).as_py())


def get_release(lake: Lake, name: str) -> Release:
    """The release called ``name``, with the channels that point at it now."""
    rows = read_release_rows(lake)
    match = rows.filter(pc.equal(rows.column("name"), name)) if rows.num_rows else rows
    if not match.num_rows:
        known = rows.column("name").to_pylist() if rows.num_rows else []
        raise ReleaseError(
            f"no release {name!r} in lake {lake.root}{did_you_mean(name, known)} "
            f"(list them with: datahub release list --lake {shlex.quote(str(lake.ref))})"
        )
    channels = tuple(sorted(c for c, r in channel_pointers(lake).items() if r == name))
    return release_from_row(match.to_pylist()[0], channels)


def list_releases(lake: Lake) -> list[Release]:
    """Every release, oldest first."""
    pointers = channel_pointers(lake)
    out = []
    for row in read_release_rows(lake).to_pylist():
        channels = tuple(sorted(c for c, r in pointers.items() if r == row["name"]))
        out.append(release_from_row(row, channels))
    return out


def read_release(lake: Lake, release: Release, *, columns: list[str] | None = None, filters: Any = None) -> pa.Table:
    """The rows of ``release`` (Delta time travel to its frozen version)."""
    return lake.read(release.table, version=release.version, columns=columns, filters=filters)


# ---- channel pointers (read side; release.channels moves them) ---------------------------------------


@dataclass(frozen=True)
class ChannelEvent:
    channel: str
    seq: int
    action: str
    release: str | None
    actor: str
    ts: datetime


def channel_history(lake: Lake, channel: str | None = None) -> list[ChannelEvent]:
    """Events of one channel (or all), in order."""
    if not lake.exists(CHANNELS_TABLE):
        return []
    rows = lake.read(CHANNELS_TABLE).sort_by([("channel", "ascending"), ("seq", "ascending")]).to_pylist()
    return [ChannelEvent(**r) for r in rows if channel is None or r["channel"] == channel]


def channel_stacks(events: list[ChannelEvent]) -> dict[str, list[str]]:
    stacks: dict[str, list[str]] = {}
    for event in events:
        stack = stacks.setdefault(event.channel, [])
        if event.action == "promote" and event.release is not None:
            stack.append(event.release)
        elif event.action == "rollback" and stack:
            stack.pop()
    return stacks


def channel_pointers(lake: Lake) -> dict[str, str | None]:
    """channel -> the release it points at now (None after rolling back its first promote)."""
    return {c: (s[-1] if s else None) for c, s in channel_stacks(channel_history(lake)).items()}
