"""Earlier take-downs left out of a new release (``release create`` after ``release redact``), in bounded memory.

The ids every ``release redact`` took down (``redacted_samples``, or inline in older records) are sorted in runs
spilled to local disk, each with the first redaction that took it (``lookup.SortedIds``); the version's
``sample_id`` (and ``source_uri``) is read once, split by the id ranges of partitions of at most ``partition_ids``
of them, the lookup set held, each partition looked up in its own rows (``datahub.release.lookup``, as ``release
redact`` does). What goes (by id, or by a redacted ``source_uri``) is spilled too: its row numbers, for the pass that
writes the rows that stay, and its ids, for the ``dropped`` lineage rows streamed to ``freeze``. Nothing per redacted
id or per excluded row stays in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.scan import scan_batches
from datahub.progress import Progress, counted
from datahub.release.digest import digest_sum
from datahub.release.freeze import PARAMS_KEY, params_text, refuse_other_try, release_txn
from datahub.release.lookup import (BATCH_ROWS, PARTITION_IDS, ROW_BATCH_ROWS, SortedIds, add_taken, rows_kept,
                                    taken_row_runs, taken_rows)
from datahub.release.materialize import commit_rows
from datahub.release.merge_dedup import ROW
from datahub.release.records import MATERIALIZED_PREFIX, REDACTED_TABLE, Release, list_releases
from datahub.release.redact import REDACT_OP

_REDACTION = "redaction"  # index of a redact release among _Redactions.records
_HITS = pa.schema([("sample_id", pa.string()), (ROW, pa.int64()), (_REDACTION, pa.int32())])


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

    def add_ids(self, lake: Lake, ids: SortedIds) -> None:
        """(sample id, redaction) of every id taken down, into ``ids`` (coded: one row per id, the first
        redaction)."""
        in_table = [(i, r.name) for i, r in enumerate(self.records) if "removed_ids" not in r.details]
        for index, record in enumerate(self.records):
            if "removed_ids" in record.details:  # a record written before redacted_samples
                inline = pa.array([str(i) for i in record.details["removed_ids"] or ()], pa.string())
                ids.add(inline, pa.repeat(pa.scalar(index, pa.int32()), len(inline)))
        if not in_table or not lake.exists(REDACTED_TABLE):
            return
        names = pa.array([n for _, n in in_table], pa.string())
        codes = pa.array([i for i, _ in in_table], pa.int32())
        for batch in scan_batches(lake.dataset(REDACTED_TABLE), columns=["sample_id", "release"],
                                  batch_rows=BATCH_ROWS):
            code = pc.take(codes, pc.index_in(batch.column("release"), value_set=names))
            valid = pc.and_(pc.is_valid(code), pc.is_valid(batch.column("sample_id")))
            ids.add(batch.column("sample_id").filter(valid), code.filter(valid))


@dataclass
class _Found:
    rows: int  # excluded rows
    digest: int  # of their ids (the multiset)
    applied: set[int]  # redactions that excluded any


def _find(dataset: Any, redactions: _Redactions, ids: SortedIds, partition_ids: int, hit_rows: SortedRuns,
          hit_ids: SortedRuns, progress: Progress | None = None) -> _Found:
    """The rows of ``dataset`` that go (``lookup.taken_rows``: one read of the version, each partition of the
    redacted ids looked up in its own rows), to ``hit_rows`` (row numbers) and ``hit_ids`` (id, row, redaction)."""
    found = _Found(0, 0, set())
    hits = taken_rows(dataset, ids, partition_ids=partition_ids, sources=redactions.by_source)
    for taken in counted(hits, progress, "find taken-down rows", total=None, rows=lambda taken: len(taken.ids)):
        found.rows += len(taken.ids)
        found.digest += digest_sum(taken.ids)
        found.applied.update(pc.unique(taken.codes).to_pylist())
        add_taken(hit_rows, taken)
        named = pc.is_valid(taken.ids)
        hit_ids.add(pa.table([taken.ids.filter(named), pa.array(taken.rows, pa.int64()).filter(named),
                              taken.codes.filter(named)], schema=_HITS))
    found.digest &= (1 << 128) - 1
    return found


def exclude_redacted(lake: Lake, name: str, *, table: str, version: int, params: dict[str, Any] | None = None,
                     fix: str = "", partition_ids: int | None = None, progress: Progress | None = None
                     ) -> tuple[str, int, dict[str, Any], Iterator[pa.Table] | None]:
    """What release ``name`` of ``table`` at ``version`` freezes, once the samples of earlier take-downs
    (``release redact``: their ids and source files) are left out.

    Returns (table, version, details, dropped lineage rows): the input itself when it holds none of them; else
    ``release_<name>``, the version minus those rows, streamed into its own table (a narrow read of ids and
    ``source_uri`` first, split by the id ranges of partitions of ``partition_ids`` redacted ids, then whole rows
    only when something goes), the
    count and the redactions applied, and one ``dropped`` lineage row per excluded sample, a stream sorted by
    sample_id read once (spilled to local disk until then). A re-run after a crash finds the materialized commit by
    its txn; one that would exclude other rows or read another version (``params``) is refused
    (``refuse_other_try``). ``partition_ids``: default ``PARTITION_IDS``. ``progress(stage, done, total)`` gets the
    rows found to leave out and the rows written.
    """
    partition_ids = partition_ids or PARTITION_IDS
    redactions = _Redactions.of(lake)
    if not redactions.records:
        return table, version, {}, None
    dataset = lake.dataset(table, version)
    redacted = SortedIds(codes=True, run_rows=partition_ids)
    hit_rows = taken_row_runs()
    hit_ids = SortedRuns(_HITS, "sample_id", order=ROW)  # each id's first row: its redaction names the drop
    try:
        with redacted:
            redactions.add_ids(lake, redacted)
            if not redacted.seal().count and not redactions.by_source:
                hit_rows.close()
                hit_ids.close()
                return table, version, {}, None
            found = _find(dataset, redactions, redacted, partition_ids, hit_rows, hit_ids, progress)
        if not found.rows:
            hit_rows.close()
            hit_ids.close()
            return table, version, {}, None
        out = MATERIALIZED_PREFIX + name
        excluded = {**(params or {}), "table": table, "version": version, "excluded": f"{found.digest:032x}"}
        refuse_other_try(lake, name, out, excluded, fix=fix)
        with hit_rows:
            kept = counted(rows_kept(dataset, hit_rows), progress, "write", total=None, rows=len)
            commit_rows(lake, out, kept, schema=pa.schema(dataset.schema),
                        txn=release_txn(name), row_group_rows=ROW_BATCH_ROWS,
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


def _dropped(hit_ids: SortedRuns, redactions: _Redactions, name: str, ref: str, ts: datetime) -> Iterator[pa.Table]:
    """One ``dropped`` lineage row per excluded sample, sorted by sample_id (the spill is removed once read)."""
    with hit_ids:
        for block in hit_ids.merged():
            yield lineage_rows(block.column("sample_id"), run_id=release_txn(name), op=REDACT_OP, action="dropped",
                               reason=redactions.why.take(block.column(_REDACTION)), ref=ref, ts=ts, sort=False)
