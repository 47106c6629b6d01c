"""``release.vacuum``: the one explicit way old table versions lose their data files.

Lake tables keep their whole Delta log (``Lake.keep_log``), so every version, and so every
release, stays readable by time travel until this runs. It deletes the data files that no
version newer than ``retention_hours`` and no release frozen on the table still needs
(deltalake ``vacuum(keep_versions=...)``). ``drop_releases`` names releases whose data may go
(e.g. the old release after a ``release redact`` take-down): they stay listed, with their
digest, but can no longer be read. A dry run unless ``apply``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from datahub.errors import ReleaseError
from datahub.lake.lake import Lake
from datahub.release.records import list_releases

# Delta's delta.deletedFileRetentionDuration default (7 days): a shorter window can delete files
# that a job running right now has written but not committed yet.
DEFAULT_RETENTION_HOURS = 168
SAFE_RETENTION_HOURS = 24


@dataclass(frozen=True)
class VacuumReport:
    table: str
    files: list[str]  # relative paths deleted (or, in a dry run, that would be)
    kept_releases: dict[str, int] = field(default_factory=dict)  # release -> version whose files were kept
    unreadable_releases: list[str] = field(default_factory=list)  # dropped releases that lose files
    applied: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _paths(lake: Lake, table: str, version: int) -> set[str]:
    actions = pa.table(lake.table(table, version=version).get_add_actions(flatten=True))
    return set(actions.column("path").to_pylist())


def vacuum(
    lake: Lake,
    table: str,
    *,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    drop_releases: Sequence[str] = (),
    apply: bool = False,
    force: bool = False,
) -> VacuumReport:
    """Delete files of ``table`` that neither recent versions nor kept releases need (dry run unless ``apply``)."""
    from deltalake import PostCommitHookProperties

    if retention_hours < 0:
        raise ReleaseError(f"--retention-hours {retention_hours}: must be >= 0")
    if retention_hours < SAFE_RETENTION_HOURS and not force:
        raise ReleaseError(
            f"--retention-hours {retention_hours} is below {SAFE_RETENTION_HOURS}: files that a running job wrote "
            "but has not committed yet would be deleted; pass --force when no job writes to this lake"
        )
    releases = list_releases(lake)
    names = {r.name: r for r in releases}
    for name in drop_releases:
        if name not in names:
            raise ReleaseError(f"--drop-release {name!r}: no such release (list them with: datahub release list "
                               f"--lake {lake.ref})")
        if names[name].table != table:
            raise ReleaseError(f"--drop-release {name!r} is frozen on table {names[name].table!r}, not {table!r}; "
                               f"vacuum that table with --table {names[name].table}")
    kept = {r.name: r.version for r in releases if r.table == table and r.name not in set(drop_releases)}
    dropped = [names[n] for n in dict.fromkeys(drop_releases)]
    before = {r.name: _paths(lake, table, r.version) for r in dropped}
    files = lake.table(table).vacuum(
        retention_hours,
        dry_run=not apply,
        enforce_retention_duration=False,  # checked above, with a message that says why
        keep_versions=sorted(set(kept.values())),
        post_commithook_properties=PostCommitHookProperties(cleanup_expired_logs=False),
    )
    gone = set(files)
    unreadable = sorted(name for name, paths in before.items() if paths & gone)
    return VacuumReport(table, sorted(files), dict(sorted(kept.items())), unreadable, apply)
