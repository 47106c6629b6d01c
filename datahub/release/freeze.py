"""Freezing a release: ``released`` lineage rows, then the ``releases`` row (committed last).

Both commits carry the app transaction ``release/<name>``, so a crash between them is
repaired by running the same command again, and a name can be committed once only.
"""

from __future__ import annotations

import getpass
import json
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.tables import LINEAGE
from datahub.release.digest import release_digest
from datahub.release.records import RELEASES, RELEASES_TABLE, Release, get_release, release_exists

RELEASE_OP = "release@1"


def release_txn(name: str) -> str:
    return f"release/{name}"


def refuse_taken(lake: Lake, name: str) -> None:
    if release_exists(lake, name):
        existing = get_release(lake, name)
        raise ReleaseError(
            f"release {name!r} already exists ({existing.table} v{existing.version}, created "
            f"{existing.created:%Y-%m-%d %H:%M} by {existing.creator}); release names are immutable: "
            "choose a new name (e.g. bump the version suffix)"
        )


def history_runs(lake: Lake, table: str, version: int) -> tuple[list[str], list[str]]:
    """Pipeline run ids and job names of the commits that built ``table`` up to ``version``."""
    run_ids: list[str] = []
    jobs: list[str] = []
    for entry in lake.history(table):
        if entry.get("version") is None or int(entry["version"]) > version:
            continue
        run_id, job = entry.get("datahub.run_id"), entry.get("datahub.job")
        if run_id and run_id not in run_ids:
            run_ids.append(str(run_id))
        if job and job not in jobs:
            jobs.append(str(job))
    return sorted(run_ids), sorted(jobs)


def _released_rows(name: str, sample_ids: pa.ChunkedArray | pa.Array, ts: datetime,
                   reason: str | pa.Array | pa.ChunkedArray | None) -> pa.Table:
    n = len(sample_ids)
    reasons = reason if isinstance(reason, (pa.Array, pa.ChunkedArray)) else pa.array([reason] * n, pa.string())
    pairs = pa.table({"sample_id": sample_ids, "reason": reasons}).filter(pc.is_valid(sample_ids))
    pairs = pairs.group_by("sample_id", use_threads=False).aggregate([("reason", "first")])
    pairs = pairs.sort_by([("sample_id", "ascending")])  # file min/max stats narrow id lookups
    return lineage_rows(pairs.column("sample_id"), run_id=release_txn(name), op=RELEASE_OP, action="released",
                        reason=pairs.column("reason_first"), ref=name, ts=ts, sort=False)


def freeze(
    lake: Lake,
    name: str,
    *,
    table: str,
    version: int,
    sample_ids: pa.ChunkedArray | pa.Array,
    kind: str,
    qa_status: str,
    parents: list[str] | None = None,
    run_ids: list[str] | None = None,
    jobs: list[str] | None = None,
    details: dict[str, Any] | None = None,
    creator: str | None = None,
    extra_lineage: pa.Table | None = None,
    released_reason: pa.Array | pa.ChunkedArray | None = None,
) -> Release:
    """Record ``name`` -> (``table``, ``version``) with its digest and one lineage row per sample."""
    # The release is read by time travel: the frozen table must keep its log even when another
    # writer (Spark add-actions, an older datahub) created it without the property.
    lake.keep_log(table)
    ts = datetime.now(timezone.utc)
    txn = release_txn(name)
    lineage = _released_rows(name, sample_ids, ts, released_reason if released_reason is not None
                             else (None if kind == "create" else kind))
    if extra_lineage is not None and extra_lineage.num_rows:
        lineage = pa.concat_tables([lineage, extra_lineage.cast(LINEAGE)]).sort_by([("sample_id", "ascending")])
    if lineage.num_rows:
        lake.commit("lineage", lineage, txn=txn, metadata={"datahub.release": name})
    if run_ids is None or jobs is None:
        found_runs, found_jobs = history_runs(lake, table, version)
        run_ids = found_runs if run_ids is None else run_ids
        jobs = found_jobs if jobs is None else jobs
    row = {
        "name": name,
        "table": table,
        "table_version": version,
        "row_count": len(sample_ids),
        "digest": release_digest(sample_ids),
        "creator": creator or _default_creator(),
        "created": ts,
        "kind": kind,
        "parents": parents or [],
        "run_ids": run_ids,
        "jobs": jobs,
        "schema_version": lake.schema_version(table),
        "qa_status": qa_status,
        "details": json.dumps(details or {}, sort_keys=True, default=str),
    }
    committed = lake.commit(RELEASES_TABLE, pa.Table.from_pylist([row], RELEASES), txn=txn,
                            metadata={"datahub.release": name})
    if committed is None:  # a concurrent creator of the same name won
        raise ReleaseError(f"release {name!r} was created concurrently by another writer; names are immutable")
    return get_release(lake, name)


def _default_creator() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return "unknown"
