"""``release.redact``: a take-down (copyright, PII) as a new release without the named samples.

The old release is untouched and stays readable through Delta time travel (lake tables keep
their log) until an explicit ``datahub release vacuum --drop-release OLD --apply`` deletes its
files; the new one is materialized in ``release_<NEW>``. Every release that
holds any of the samples is listed, and lineage records a ``dropped`` event with the reason. The ids taken
down are rows of the lake table ``redacted_samples`` (sample_id, release), read back by ``redacted_ids``; the
release record keeps their count (records written before that table hold them inline, and are still read).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.scan import scan_batches
from datahub.release.digest import digest_sum
from datahub.release.freeze import PARAMS_KEY, freeze, params_text, refuse_other_try, refuse_taken, release_txn
from datahub.release.materialize import commit_rows
from datahub.release.records import (
    MATERIALIZED_PREFIX,
    REDACTED,
    REDACTED_TABLE,
    Release,
    check_name,
    get_release,
    list_releases,
    read_release,
)

REDACT_OP = "release.redact@1"
BATCH_ROWS = 8192  # of ids and source_uri
# whole rows: batches read and Parquet row groups written (delta-rs buffers a row group; 32k rows of 5 KB texts
# would be 160 MB)
ROW_BATCH_ROWS = 2048


def read_ids_file(path: str) -> list[str]:
    """One sample id per line; blank lines and ``#`` comments ignored."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.split("#", 1)[0].strip() for line in handle if line.split("#", 1)[0].strip()]
    except OSError as exc:
        raise ReleaseError(f"--ids-file {path}: cannot read it: {exc.strerror}") from None


def releases_containing(lake: Lake, *, sample_ids: list[str] | pa.Array,
                        source_uri: str | None = None) -> dict[str, int]:
    """release name -> how many of the samples (ids, or rows from ``source_uri``) it holds."""
    import pyarrow.dataset as ds  # here, not at import: pyarrow.dataset loads pandas (~0.3-0.9 s of CLI start-up)

    condition = ds.field("sample_id").isin(sample_ids) if len(sample_ids) else None
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
    params = {"kind": "redact", "source": source, "reason": reason, "source_uri": source_uri,
              "sample_ids": f"{len(ids)} ids, sha256 {hashlib.sha256(chr(10).join(ids).encode()).hexdigest()[:16]}"}
    table = MATERIALIZED_PREFIX + new
    refuse_other_try(lake, new, table, params, fix="the same --from, --reason and samples")
    parent = get_release(lake, source)
    dataset = lake.dataset(parent.table, parent.version)
    has_source = "source_uri" in dataset.schema.names
    if source_uri is not None and not has_source:
        raise ReleaseError(f"release {source!r} has no source_uri column; redact it by --sample ID instead")
    wanted = pa.array(ids, pa.string())

    def target_of(batch: pa.RecordBatch) -> pa.Array:
        target = pc.is_in(batch.column("sample_id"), value_set=wanted)
        if source_uri is not None:
            target = pc.or_(target, pc.fill_null(pc.equal(batch.column("source_uri"), source_uri), False))
        return target

    # pass 1 (ids and source_uri only): what goes (freeze scans the ids that stay from the new table)
    removed_chunks: list[pa.Array] = []
    for batch in scan_batches(dataset, columns=["sample_id", "source_uri"] if has_source else ["sample_id"],
                              batch_rows=BATCH_ROWS):
        target = target_of(batch)
        removed_chunks.append(pc.filter(batch.column("sample_id"), target))
    removed_rows = sum(len(c) for c in removed_chunks)
    if not removed_rows:
        what = f"source {source_uri!r}" if source_uri and not ids else f"{len(ids)} given sample id(s)"
        raise ReleaseError(f"release {source!r} holds none of the {what}; nothing to redact "
                           f"(find where a sample is with: datahub lineage SAMPLE_ID --lake {lake.ref})")
    removed_ids = pc.unique(pa.chunked_array(removed_chunks, pa.string())).sort()
    named = pc.unique(pa.concat_arrays([wanted, removed_ids])).sort()
    contained_in = releases_containing(lake, sample_ids=named, source_uri=source_uri)
    ts = datetime.now(timezone.utc)
    ref = json.dumps({"release": new, "from": source, "reason": reason, "source_uri": source_uri})
    dropped = lineage_rows(removed_ids, run_id=release_txn(new), op=REDACT_OP, action="dropped",
                           reason=f"redacted: {reason}", ref=ref, ts=ts)

    def kept() -> Iterator[pa.Table]:  # pass 2: every column, streamed into the commit
        for batch in scan_batches(dataset, batch_rows=ROW_BATCH_ROWS):
            yield pa.Table.from_batches([batch]).filter(pc.invert(target_of(batch)))

    # written here and committed as add actions: delta-rs's writer buffers up to a target-size file of rows
    commit_rows(lake, table, kept(), txn=release_txn(new), schema=pa.schema(dataset.schema),
                row_group_rows=ROW_BATCH_ROWS, metadata={"datahub.release": new, "datahub.redact_reason": reason,
                                                         PARAMS_KEY: params_text(params)})
    version = int(lake.table(table).version())
    commit_rows(lake, REDACTED_TABLE, _redacted_rows(removed_ids, new), txn=release_txn(new), schema=REDACTED,
                row_group_rows=BATCH_ROWS * 8, metadata={"datahub.release": new})
    details = {"reason": reason, "removed": removed_rows, "removed_ids_table": REDACTED_TABLE,
               "requested_ids": len(ids), "source_uri": source_uri, "contained_in": contained_in}
    return freeze(lake, new, table=table, version=version, kind="redact", qa_status="inherited", parents=[source],
                  creator=creator, details=details, extra_lineage=dropped, run_ids=list(parent.run_ids),
                  jobs=list(parent.jobs), params=params, fix="the same --from, --reason and samples")


def _redacted_rows(ids: pa.Array, release: str) -> Iterator[pa.Table]:
    for start in range(0, len(ids), BATCH_ROWS * 8):
        chunk = ids.slice(start, BATCH_ROWS * 8)
        yield pa.table({"sample_id": chunk, "release": pa.repeat(release, len(chunk))}, schema=REDACTED)


def redacted_ids(lake: Lake, release: Release | str) -> pa.Array:
    """The sample ids a ``release redact`` took down (sorted): from ``redacted_samples``, or inline in a record
    written before that table (``details["removed_ids"]``)."""
    record = get_release(lake, release) if isinstance(release, str) else release
    if record.kind != "redact":
        raise ReleaseError(f"release {record.name!r} is a {record.kind!r} release, not a redact; it took nothing down")
    return _redacted(lake, [record])[1]


def _redacted(lake: Lake, records: list[Release]) -> tuple[pa.Array, pa.Array]:
    """(redact release, sample id) of every id the ``records`` (redact releases) took down, in their order."""
    import pyarrow.dataset as ds  # here, not at import: pyarrow.dataset loads pandas

    in_table = [r.name for r in records if "removed_ids" not in r.details]
    stored = (lake.read(REDACTED_TABLE, columns=["sample_id", "release"],
                        filters=ds.field("release").isin(in_table)) if in_table and lake.exists(REDACTED_TABLE)
              else REDACTED.empty_table())
    releases: list[pa.Array] = []
    ids: list[pa.Array] = []
    for record in records:
        if "removed_ids" in record.details:  # a record written before redacted_samples
            taken = pa.array(sorted(str(i) for i in record.details["removed_ids"] or ()), pa.string())
        else:
            rows = stored.filter(pc.equal(stored.column("release"), record.name))
            taken = rows.column("sample_id").combine_chunks().sort() if rows.num_rows else pa.array([], pa.string())
        ids.append(taken)
        releases.append(pa.repeat(record.name, len(taken)))
    if not ids:
        return pa.array([], pa.string()), pa.array([], pa.string())
    return pa.concat_arrays(releases), pa.concat_arrays(ids)


def redactions(lake: Lake) -> tuple[pa.Array, pa.Array, dict[str, str], dict[str, str]]:
    """Every take-down recorded so far: (sample ids, the redact release of each, source_uri -> redact release,
    redact release -> its lineage reason); the first redaction of a sample wins."""
    by_source: dict[str, str] = {}
    why: dict[str, str] = {}
    records = [r for r in list_releases(lake) if r.kind == "redact"]
    for release in records:
        why[release.name] = f"redacted: {release.details.get('reason', '')} (release redact {release.name})"
        if release.details.get("source_uri"):
            by_source.setdefault(str(release.details["source_uri"]), release.name)
    releases, ids = _redacted(lake, records)
    first = _first_of_each(ids)
    return ids.filter(first), releases.filter(first), by_source, why


def exclude_redacted(lake: Lake, name: str, *, table: str, version: int, params: dict[str, Any] | None = None,
                     fix: str = "") -> tuple[str, int, dict[str, Any], pa.Table | None]:
    """What release ``name`` of ``table`` at ``version`` freezes, once the samples of earlier take-downs
    (``release redact``: their ids and source files) are left out.

    Returns (table, version, details, dropped lineage rows): the input itself when it holds none of them; else
    ``release_<name>``, the version minus those rows, streamed into its own table (two narrow passes: ids and
    ``source_uri`` first, then whole rows only when something goes), the count and the redactions applied, and one
    ``dropped`` lineage row per excluded sample. A re-run after a crash finds the materialized commit by its txn;
    one that would exclude other rows or read another version (``params``) is refused (``refuse_other_try``).
    """
    ids, id_by, by_source, why = redactions(lake)  # id_by: the redact release of each id
    if not len(ids) and not by_source:
        return table, version, {}, None
    dataset = lake.dataset(table, version)
    has_source = "source_uri" in dataset.schema.names
    if not has_source:
        by_source = {}
    sources = pa.array(sorted(by_source), pa.string())
    source_by = pa.array([by_source[u] for u in sources.to_pylist()], pa.string())

    def target_of(batch: pa.RecordBatch) -> pa.Array:
        target = pc.is_in(batch.column("sample_id"), value_set=ids)
        if len(sources):
            target = pc.or_(target, pc.fill_null(pc.is_in(batch.column("source_uri"), value_set=sources), False))
        return pc.fill_null(target, False)

    columns = ["sample_id", "source_uri"] if has_source else ["sample_id"]
    hit_ids: list[pa.Array] = []
    hit_by: list[pa.Array] = []  # the redact release of each excluded row: by its id, else by its source
    for batch in scan_batches(dataset, columns=columns, batch_rows=BATCH_ROWS):
        target = target_of(batch)
        if not pc.any(target).as_py():
            continue
        hits = pa.Table.from_batches([batch]).filter(target).combine_chunks()
        hit_ids.append(hits.column("sample_id").chunk(0))
        by = pc.take(id_by, pc.index_in(hits.column("sample_id"), value_set=ids))
        if len(sources):
            by = pc.coalesce(by, pc.take(source_by, pc.index_in(hits.column("source_uri"), value_set=sources)))
        hit_by.append(by.combine_chunks() if isinstance(by, pa.ChunkedArray) else by)
    rows = sum(len(a) for a in hit_ids)
    if not rows:
        return table, version, {}, None
    from datahub.release.materialize import commit_rows

    def kept() -> Iterator[pa.Table]:
        for batch in scan_batches(dataset, batch_rows=ROW_BATCH_ROWS):
            yield pa.Table.from_batches([batch]).filter(pc.invert(target_of(batch)))

    out = MATERIALIZED_PREFIX + name
    excluded = {**(params or {}), "table": table, "version": version,
                "excluded": f"{digest_sum(pa.chunked_array(hit_ids, pa.string())):032x}"}
    refuse_other_try(lake, name, out, excluded, fix=fix)
    commit_rows(lake, out, kept(), schema=pa.schema(dataset.schema), txn=release_txn(name),
                row_group_rows=ROW_BATCH_ROWS,
                metadata={"datahub.release": name, "datahub.redactions_excluded_from": f"{table}@v{version}",
                          PARAMS_KEY: params_text(excluded)})
    releases = pa.concat_arrays(hit_by)
    applied = sorted(pc.unique(releases).to_pylist())
    details = {"from_table": table, "from_version": version,
               "redacted_excluded": {"rows": rows, "by": applied}}
    dropped_ids = pa.chunked_array(hit_ids, pa.string()).combine_chunks()
    first = _first_of_each(dropped_ids)
    reasons = pc.take(pa.array([why[r] for r in applied], pa.string()),
                      pc.index_in(releases, value_set=pa.array(applied, pa.string())))
    dropped = lineage_rows(dropped_ids.filter(first), run_id=release_txn(name), op=REDACT_OP, action="dropped",
                           reason=reasons.filter(first),
                           ref=json.dumps({"release": name, "from_table": table, "redactions": applied}),
                           ts=datetime.now(timezone.utc))
    return out, int(lake.table(out).version()), details, dropped


def _first_of_each(ids: pa.Array) -> pa.Array:
    """True at the first occurrence of each id (a sample may be in the table more than once)."""
    # index_in over the array itself finds each value's first position
    return pc.equal(pc.index_in(ids, value_set=ids), pa.array(np.arange(len(ids), dtype=np.int32)))
