"""``release.events``: archive / unarchive / read events of releases, the tier policy's inputs.

Releases are immutable rows, so what happens to a release later is an append-only event in
the ``release_events`` table (like ``release_channels``):

- ``archived`` / ``unarchived``: the last of them says whether the release is archived (the
  storage policy sends archived releases to the cold tiers). Per-release ``seq`` numbers are
  part of the commit txn, so two writers racing on one release cannot both win.
- ``read``: someone trained on (or otherwise read) the release. At most one per release per
  UTC day (``seq`` is the day as YYYYMMDD): every rank of a job, or a cron job, may record the
  same read and only the first commit lands. The policy works in days, so one read a day is enough.

Each event is committed as an overwrite of its own (release, event kind, seq) slot with the
txn id: Delta's conflict check then makes racing writers of one slot fail and find the txn
applied (a no-op). A plain append would not do: delta-rs does not check concurrent app
transaction ids, so two racing appends of one txn both land.

Reads are recorded explicitly (``record_read`` or ``datahub tier touch``), not by the loader:
trainers usually hold read-only credentials to the lake, and N ranks must not become N writers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import CommitConflictError, ReleaseError
from datahub.lake.lake import Lake
from datahub.release.records import get_release

EVENTS_TABLE = "release_events"
ARCHIVED, UNARCHIVED, READ = "archived", "unarchived", "read"

EVENTS = pa.schema(
    [
        ("release", pa.string()),
        ("event", pa.string()),  # archived | unarchived | read
        ("seq", pa.int64()),  # archive state changes: 1, 2, ... per release; reads: the UTC day, YYYYMMDD
        ("actor", pa.string()),
        ("detail", pa.string()),  # free text: why archived, who read (job name, host)
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass(frozen=True)
class ReleaseActivity:
    """What the events say about one release now."""

    archived: bool = False
    last_read: datetime | None = None


def release_activity(lake: Lake) -> dict[str, ReleaseActivity]:
    """release -> archived flag and last read time, from one read of ``release_events``."""
    if not lake.exists(EVENTS_TABLE):
        return {}
    rows = lake.read(EVENTS_TABLE, columns=["release", "event", "seq", "ts"])
    out: dict[str, ReleaseActivity] = {}
    state = rows.filter(pc.is_in(rows["event"], pa.array([ARCHIVED, UNARCHIVED])))
    archived: dict[str, bool] = {}
    for row in state.sort_by([("release", "ascending"), ("seq", "ascending")]).to_pylist():
        archived[row["release"]] = row["event"] == ARCHIVED  # the last state change wins
    reads = rows.filter(pc.equal(rows["event"], READ)).group_by("release").aggregate([("ts", "max")])
    last_read = dict(zip(reads["release"].to_pylist(), reads["ts_max"].to_pylist()))
    for name in set(archived) | set(last_read):
        out[name] = ReleaseActivity(archived=archived.get(name, False), last_read=last_read.get(name))
    return out


def is_archived(lake: Lake, name: str) -> bool:
    return release_activity(lake).get(name, ReleaseActivity()).archived


def archive_release(lake: Lake, name: str, *, undo: bool = False, reason: str | None = None,
                    actor: str | None = None) -> bool:
    """Mark release ``name`` archived (``undo``: no longer archived). Returns False when it already was."""
    get_release(lake, name)  # refuses unknown releases, with a did-you-mean
    if is_archived(lake, name) != undo:
        return False
    seq = _state_changes(lake, name) + 1
    event = UNARCHIVED if undo else ARCHIVED
    committed = _append(lake, name, event, seq=seq, detail=reason, actor=actor, txn=f"release-archive/{name}/{seq}",
                        slot=f"event IN ('{ARCHIVED}', '{UNARCHIVED}')")
    if not committed:
        if is_archived(lake, name) != undo:  # a racer made the same change
            return False
        raise ReleaseError(f"release {name!r} was archived or unarchived by another writer at the same time; "
                           f"check `datahub tier plan --lake {lake.ref}` and retry")
    return True


def record_read(lake: Lake, name: str, *, reader: str | None = None, actor: str | None = None,
                at: datetime | None = None) -> bool:
    """Record that ``name`` was read on the UTC day of ``at`` (default now; e.g. replayed from trainer logs).

    Returns False when a read of that day was recorded already.
    """
    get_release(lake, name)
    at = (at or datetime.now(timezone.utc)).astimezone(timezone.utc)
    txn = f"release-read/{name}/{at:%Y-%m-%d}"
    if lake.applied(EVENTS_TABLE, txn):
        return False
    return _append(lake, name, READ, seq=int(f"{at:%Y%m%d}"), detail=reader, actor=actor, txn=txn, ts=at,
                   slot=f"event = '{READ}'")


def _state_changes(lake: Lake, name: str) -> int:
    if not lake.exists(EVENTS_TABLE):
        return 0
    rows = lake.read(EVENTS_TABLE, columns=["release", "event"],
                     filters=(pc.field("release") == name) & pc.field("event").isin([ARCHIVED, UNARCHIVED]))
    return rows.num_rows


def _append(lake: Lake, name: str, event: str, *, seq: int, detail: str | None, actor: str | None, txn: str,
            slot: str, ts: datetime | None = None) -> bool:
    """Commit one event into its (release, kind, seq) slot; False when ``txn`` was committed already."""
    _ensure_table(lake)
    row = {"release": name, "event": event, "seq": seq, "actor": actor or _actor(), "detail": detail,
           "ts": ts or datetime.now(timezone.utc)}
    # release names are checked ([A-Za-z0-9_.-]), so quoting them into the predicate is safe
    predicate = f"release = '{name}' AND {slot} AND seq = {seq}"
    from deltalake.exceptions import CommitFailedError  # Lake.commit lets it out of its table-property step

    for attempt in range(3):
        try:
            version = lake.commit(EVENTS_TABLE, pa.Table.from_pylist([row], EVENTS), txn=txn, schema=EVENTS,
                                  mode="overwrite", predicate=predicate)
            return version is not None
        except (CommitConflictError, CommitFailedError):  # a racer changed the slot (or the table's metadata) first
            if lake.applied(EVENTS_TABLE, txn):
                return False
            if attempt == 2:
                raise
    return False


def _ensure_table(lake: Lake) -> None:
    """Create the empty table first: an overwrite on a missing table would ignore its predicate."""
    if lake.exists(EVENTS_TABLE):
        return
    try:
        lake.commit(EVENTS_TABLE, EVENTS.empty_table(), txn="release-events/create", schema=EVENTS)
    except Exception:  # noqa: BLE001 - two first writers race to create it; either outcome is a table
        if not lake.exists(EVENTS_TABLE):
            raise


def _actor() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "unknown"
