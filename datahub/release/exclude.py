"""Earlier take-downs left out of a new release (``release create`` after ``release redact``), in bounded memory.

The ids every ``release redact`` took down (``redacted_samples``, or inline in older records) are sorted in runs
spilled to local disk, each with the first redaction that took it; the version's ``sample_id`` (and ``source_uri``)
is scanned once per partition of at most ``partition_ids`` of them, the lookup set held. What goes (by id, or by a
redacted ``source_uri``) is spilled too: its row numbers, for the pass that writes the rows that stay, and its ids,
for the ``dropped`` lineage rows streamed to ``freeze``. Nothing per redacted id or per excluded row stays in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.scan import scan_batches
from datahub.release.digest import digest_sum
from datahub.release.freeze import PARAMS_KEY, params_text, refuse_other_try, regrouped, release_txn
from datahub.release.materialize import commit_rows
from datahub.release.merge_dedup import ROW, RowCursor
from datahub.release.records import MATERIALIZED_PREFIX, REDACTED_TABLE, Release, list_releases
from datahub.release.redact import (BATCH_ROWS, PARTITION_IDS, REDACT_OP, ROW_BATCH_ROWS, _coalesced)

_REDACTION = "redaction"  # index of a redact release among _Redactions.records
_REDACTED_BY = pa.schema([("sample_id", pa.string()), (_REDACTION, pa.int32())])
_HITS = pa.schema([("sample_id", pa.string()), (ROW, pa.int64()), (_REDACTION, pa.int32())])
_HIT_ROWS = pa.schema([(ROW, pa.int64())])


@dataclass
class _Redactions:
    """Every take-down recorded so far; an id's or a source's first redaction (in this order) is the one named."""

    records: list[Release]  # the redact releases
    why: pa.Array  # the lineage reason of each record's drops
    by_source: dict[str, int]  # source_uri -> its first redaction

    @classmethod
    def of(cls, lake: Lake) -> _Redactions:
        records = [r for r in list_releases(lake) if r.kind == "redact"]
        by_source: dict[str, int] = {}
        for index, record in enumerate(records):
            if record.details.get("source_uri"):
                by_source.setdefault(str(record.details["source_uri"]), index)
        why = pa.array([f"redacted: {r.details.get('reason', '')} (release redact {r.name})" for r in records],
                       pa.string())
        return cls(records, why, by_source)

    def add_ids(self, lake: Lake, runs: SortedRuns) -> None:
        """(sample id, redaction) of every id taken down, into ``runs`` (one row per id: the first redaction)."""
        in_table = [(i, r.name) for i, r in enumerate(self.records) if "removed_ids" not in r.details]
        for index, record in enumerate(self.records):
            if "removed_ids" in record.details:  # a record written before redacted_samples
                ids = pa.array([str(i) for i in record.details["removed_ids"] or ()], pa.string())
                runs.add(pa.table([ids, pa.repeat(pa.scalar(index, pa.int32()), len(ids))], schema=_REDACTED_BY))
        if not in_table or not lake.exists(REDACTED_TABLE):
            return
        names = pa.array([n for _, n in in_table], pa.string())
        codes = pa.array([i for i, _ in in_table], pa.int32())
        for batch in scan_batches(lake.dataset(REDACTED_TABLE), columns=["sample_id", "release"],
                                  batch_rows=BATCH_ROWS):
            code = pc.take(codes, pc.index_in(batch.column("release"), value_set=names))
            valid = pc.and_(pc.is_valid(code), pc.is_valid(batch.column("sample_id")))
            runs.add(pa.table([batch.column("sample_id").filter(valid), code.filter(valid)], schema=_REDACTED_BY))


@dataclass
class _Found:
    rows: int  # excluded rows
    digest: int  # of their ids (the multiset)
    applied: set[int]  # redactions that excluded any


def _find(dataset: Any, redactions: _Redactions, partitions: Iterator[pa.Table], hit_rows: SortedRuns,
          hit_ids: SortedRuns) -> _Found:
    """Scan ``dataset`` once per partition of the redacted ids (once when there are none: sources only); the rows
    that go to ``hit_rows`` (row numbers) and ``hit_ids`` (id, row, redaction). A row whose id is in no partition is looked at for its source in one pass
    only: the one whose share of the (sorted) id range holds it (rows without an id: the last one)."""
    has_source = "source_uri" in dataset.schema.names
    by_source = redactions.by_source if has_source else {}
    sources = pa.array(sorted(by_source), pa.string())
    source_codes = pa.array([by_source[u] for u in sources.to_pylist()], pa.int32())
    columns = ["sample_id", "source_uri"] if len(sources) else ["sample_id"]
    found = _Found(0, 0, set())
    partition = next(partitions, None)
    low: pa.Scalar | None = None
    while True:
        following = next(partitions, None)
        high = following.column("sample_id")[0] if following is not None else None
        ids = partition.column("sample_id").chunk(0) if partition is not None else None
        codes = partition.column(_REDACTION).chunk(0) if partition is not None else None
        # pc.index_in builds the value set's hash table at every call: batches at least as long as the partition
        lookup_rows = max(BATCH_ROWS, len(ids) if ids is not None else 0)
        first = 0
        for batch in _coalesced(scan_batches(dataset, columns=columns, batch_rows=lookup_rows), lookup_rows):
            column = batch.column("sample_id")
            by = (pc.take(codes, pc.index_in(column, value_set=ids)) if ids is not None
                  else pa.nulls(len(column), pa.int32()))
            if len(sources):
                mine = pa.repeat(pa.scalar(True), len(column))
                if low is not None:
                    mine = pc.and_(mine, pc.greater_equal(column, low))
                if high is not None:
                    mine = pc.and_(mine, pc.less(column, high))
                mine = pc.fill_null(mine, high is None)
                by_uri = pc.take(source_codes, pc.index_in(batch.column("source_uri"), value_set=sources))
                by = pc.coalesce(by, pc.if_else(mine, by_uri, pa.nulls(len(column), pa.int32())))
            hit = pc.is_valid(by)
            if pc.any(hit).as_py():
                rows = np.flatnonzero(hit.to_numpy(zero_copy_only=False)) + first
                hits, hit_by = column.filter(hit), by.filter(hit)
                found.rows += len(hits)
                found.digest += digest_sum(hits)
                found.applied.update(pc.unique(hit_by).to_pylist())
                hit_rows.add(pa.table([pa.array(rows, pa.int64())], schema=_HIT_ROWS))
                named = pc.is_valid(hits)
                hit_ids.add(pa.table([hits.filter(named), pa.array(rows, pa.int64()).filter(named),
                                      hit_by.filter(named)], schema=_HITS))
            first += batch.num_rows
        if following is None:
            break
        partition, low = following, high
    found.digest &= (1 << 128) - 1
    return found


def exclude_redacted(lake: Lake, name: str, *, table: str, version: int, params: dict[str, Any] | None = None,
                     fix: str = "", partition_ids: int | None = None
                     ) -> tuple[str, int, dict[str, Any], Iterator[pa.Table] | None]:
    """What release ``name`` of ``table`` at ``version`` freezes, once the samples of earlier take-downs
    (``release redact``: their ids and source files) are left out.

    Returns (table, version, details, dropped lineage rows): the input itself when it holds none of them; else
    ``release_<name>``, the version minus those rows, streamed into its own table (narrow passes over ids and
    ``source_uri`` first, one per ``partition_ids`` redacted ids, then whole rows only when something goes), the
    count and the redactions applied, and one ``dropped`` lineage row per excluded sample, a stream sorted by
    sample_id read once (spilled to local disk until then). A re-run after a crash finds the materialized commit by
    its txn; one that would exclude other rows or read another version (``params``) is refused
    (``refuse_other_try``). ``partition_ids``: default ``PARTITION_IDS``.
    """
    partition_ids = partition_ids or PARTITION_IDS
    redactions = _Redactions.of(lake)
    if not redactions.records:
        return table, version, {}, None
    dataset = lake.dataset(table, version)
    redacted = SortedRuns(_REDACTED_BY, "sample_id", order=_REDACTION, run_rows=partition_ids)
    hit_rows = SortedRuns(_HIT_ROWS, ROW)
    hit_ids = SortedRuns(_HITS, "sample_id", order=ROW)  # each id's first row: its redaction names the drop
    try:
        with redacted:
            redactions.add_ids(lake, redacted)
            partitions = regrouped(redacted.merged(), partition_ids)
            first = next(partitions, None)
            if first is None and not redactions.by_source:
                hit_rows.close()
                hit_ids.close()
                return table, version, {}, None
            found = _find(dataset, redactions, _with_first(first, partitions) if first is not None else iter(()),
                          hit_rows, hit_ids)
        if not found.rows:
            hit_rows.close()
            hit_ids.close()
            return table, version, {}, None
        out = MATERIALIZED_PREFIX + name
        excluded = {**(params or {}), "table": table, "version": version, "excluded": f"{found.digest:032x}"}
        refuse_other_try(lake, name, out, excluded, fix=fix)
        with hit_rows:
            commit_rows(lake, out, _kept(dataset, hit_rows), schema=pa.schema(dataset.schema), txn=release_txn(name),
                        row_group_rows=ROW_BATCH_ROWS,
                        metadata={"datahub.release": name, "datahub.redactions_excluded_from": f"{table}@v{version}",
                                  PARAMS_KEY: params_text(excluded)})
    except BaseException:
        hit_rows.close()
        hit_ids.close()
        raise
    applied = sorted(redactions.records[i].name for i in found.applied)
    details = {"from_table": table, "from_version": version, "redacted_excluded": {"rows": found.rows, "by": applied}}
    ref = json.dumps({"release": name, "from_table": table, "redactions": applied})
    return out, int(lake.table(out).version()), details, _dropped(hit_ids, redactions, name, ref,
                                                                  datetime.now(timezone.utc))


def _with_first(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    yield first
    yield from rest


def _kept(dataset: Any, hit_rows: SortedRuns) -> Iterator[pa.Table]:
    """Every column of the rows that stay, in the version's order (the gone rows' numbers read back in order)."""
    gone = RowCursor(hit_rows.merged(), _HIT_ROWS)
    first = 0
    for batch in scan_batches(dataset, batch_rows=ROW_BATCH_ROWS):
        rows = gone.take(first, first + batch.num_rows).column(ROW).to_numpy() - first
        first += batch.num_rows
        keep = np.ones(batch.num_rows, dtype=bool)
        keep[rows] = False
        yield pa.Table.from_batches([batch]).filter(pa.array(keep))


def _dropped(hit_ids: SortedRuns, redactions: _Redactions, name: str, ref: str, ts: datetime) -> Iterator[pa.Table]:
    """One ``dropped`` lineage row per excluded sample, sorted by sample_id (the spill is removed once read)."""
    with hit_ids:
        for block in hit_ids.merged():
            yield lineage_rows(block.column("sample_id"), run_id=release_txn(name), op=REDACT_OP, action="dropped",
                               reason=redactions.why.take(block.column(_REDACTION)), ref=ref, ts=ts, sort=False)
