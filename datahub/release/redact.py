"""``release.redact``: a take-down (copyright, PII) as a new release without the named samples.

The old release is untouched and stays readable through Delta time travel (lake tables keep
their log) until an explicit ``datahub release vacuum --drop-release OLD --apply`` deletes its
files; the new one is materialized in ``release_<NEW>``. Every release that
holds any of the samples is listed, and lineage records a ``dropped`` event with the reason.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from datahub.errors import ReleaseError
from datahub.lake.lake import Lake
from datahub.lake.tables import LINEAGE
from datahub.release.freeze import freeze, refuse_taken, release_txn
from datahub.release.records import (
    MATERIALIZED_PREFIX,
    Release,
    check_name,
    get_release,
    list_releases,
    read_release,
)

REDACT_OP = "release.redact@1"


def read_ids_file(path: str) -> list[str]:
    """One sample id per line; blank lines and ``#`` comments ignored."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.split("#", 1)[0].strip() for line in handle if line.split("#", 1)[0].strip()]
    except OSError as exc:
        raise ReleaseError(f"--ids-file {path}: cannot read it: {exc.strerror}") from None


def releases_containing(lake: Lake, *, sample_ids: list[str], source_uri: str | None = None) -> dict[str, int]:
    """release name -> how many of the samples (ids, or rows from ``source_uri``) it holds."""
    condition = ds.field("sample_id").isin(sample_ids) if sample_ids else None
    if source_uri is not None:
        by_source = ds.field("source_uri") == source_uri
        condition = by_source if condition is None else (condition | by_source)
    if condition is None:
        return {}
    found: dict[str, int] = {}
    for release in list_releases(lake):
        hits = read_release(lake, release, columns=["sample_id"], filters=condition)
        count = len(pc.unique(hits.column("sample_id"))) if hits.num_rows else 0
        if count:
            found[release.name] = count
    return found


def redact(
    lake: Lake,
    new: str,
    *,
    source: str,
    reason: str,
    sample_ids: list[str] | None = None,
    source_uri: str | None = None,
    creator: str | None = None,
) -> Release:
    """Release ``new`` = release ``source`` minus the given samples (or every sample of ``source_uri``).

    ``details["contained_in"]`` lists every release (old and new) that holds any of them.
    """
    check_name(new)
    if not reason or not reason.strip():
        raise ReleaseError("redact needs --reason TEXT (e.g. 'copyright take-down request #123'); it is recorded in lineage")
    ids = sorted(set(sample_ids or []))
    if not ids and source_uri is None:
        raise ReleaseError("redact needs what to remove: --sample ID (repeatable), --ids-file F or --source URI")
    refuse_taken(lake, new)
    parent = get_release(lake, source)
    rows = read_release(lake, parent)
    target = pc.is_in(rows.column("sample_id"), value_set=pa.array(ids, pa.string()))
    if source_uri is not None:
        target = pc.or_(target, pc.fill_null(pc.equal(rows.column("source_uri"), source_uri), False))
    removed = rows.filter(target)
    if not removed.num_rows:
        what = f"source {source_uri!r}" if source_uri and not ids else f"{len(ids)} given sample id(s)"
        raise ReleaseError(f"release {source!r} holds none of the {what}; nothing to redact "
                           f"(find where a sample is with: datahub lineage SAMPLE_ID --lake {lake.ref})")
    kept = rows.filter(pc.invert(target))
    removed_ids = pc.unique(removed.column("sample_id"))
    contained_in = releases_containing(lake, sample_ids=sorted(set(ids) | set(removed_ids.to_pylist())),
                                       source_uri=source_uri)
    ts = datetime.now(timezone.utc)
    n = len(removed_ids)
    ref = json.dumps({"release": new, "from": source, "reason": reason, "source_uri": source_uri})
    dropped = pa.table(
        {
            "sample_id": removed_ids,
            "run_id": pa.array([release_txn(new)] * n, pa.string()),
            "op": pa.array([REDACT_OP] * n, pa.string()),
            "params_hash": pa.nulls(n, pa.string()),
            "action": pa.array(["dropped"] * n, pa.string()),
            "reason": pa.array([f"redacted: {reason}"] * n, pa.string()),
            "ref": pa.array([ref] * n, pa.string()),
            "ts": pa.array([ts] * n, pa.timestamp("us", tz="UTC")),
        },
        schema=LINEAGE,
    )
    table = MATERIALIZED_PREFIX + new
    lake.commit(table, kept, txn=release_txn(new), metadata={"datahub.release": new, "datahub.redact_reason": reason})
    version = int(lake.table(table).version())
    details = {"reason": reason, "removed": removed.num_rows, "removed_ids": sorted(removed_ids.to_pylist()),
               "requested_ids": len(ids), "source_uri": source_uri, "contained_in": contained_in}
    return freeze(lake, new, table=table, version=version, sample_ids=kept.column("sample_id"), kind="redact",
                  qa_status="inherited", parents=[source], creator=creator, details=details,
                  extra_lineage=dropped, run_ids=list(parent.run_ids), jobs=list(parent.jobs))
