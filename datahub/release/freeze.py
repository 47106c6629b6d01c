"""Freezing a release: ``released`` lineage rows, then the ``releases`` row (committed last).

Both commits carry the app transaction ``release/<name>``, so a crash between them is
repaired by running the same command again, and a name can be committed once only. Every commit
under that txn also records what it stands for (``datahub.release_params``: the table and version,
the command's arguments, the released ids' digest): a re-run whose arguments or data differ from the
first try's is refused (``refuse_other_try``), since its commits would be skipped as applied and the
record would describe other rows than the committed ones.
"""

from __future__ import annotations

import getpass
import hashlib
import json
from datetime import datetime, timezone
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError
from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.tables import LINEAGE
from datahub.lake.scan import scan_batches
from datahub.progress import Progress, counted
from datahub.release.digest import DIGEST_SCHEME, digest_sum
from datahub.release.evalset_gate import refuse_evalsets_since
from datahub.release.materialize import commit_rows
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


PARAMS_KEY = "datahub.release_params"  # commit metadata: what a commit under txn release/<name> stands for


def params_text(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def committed_params(lake: Lake, table: str, name: str) -> dict[str, Any] | None:
    """What release ``name``'s commit to ``table`` recorded (None: no such commit; {}: a commit of an older datahub
    that recorded nothing)."""
    txn = release_txn(name)
    if not lake.applied(table, txn):
        return None
    for entry in lake.history(table):
        if entry.get("datahub.txn") == txn:
            try:
                recorded = json.loads(entry.get(PARAMS_KEY) or "{}")
            except ValueError:
                return {}
            return recorded if isinstance(recorded, dict) else {}
    return {}


_CONTENT = ("frozen", "rows", "digest", "excluded")  # recorded from the data, not given by the command


def refuse_other_try(lake: Lake, name: str, table: str, params: dict[str, Any], *, fix: str = "") -> None:
    """Refuse a re-run of a half-created release ``name`` (its ``table`` commit is in, its record is not) whose
    ``params`` differ from the first try's: that commit would be skipped and the record would not describe it."""
    recorded = committed_params(lake, table, name)
    if not recorded:  # not committed yet (or by a datahub that recorded nothing: nothing to compare)
        return
    mine = json.loads(params_text(params))
    differ = sorted(k for k in set(recorded) | set(mine) if k in mine and recorded.get(k) != mine.get(k))
    if not differ:
        return
    differ = [k for k in differ if k not in _CONTENT] or differ  # the arguments that differ say why the rows do
    first = ", ".join(f"{k}={json.dumps(recorded.get(k))}" for k in differ)
    this = ", ".join(f"{k}={json.dumps(mine.get(k))}" for k in differ)
    raise ReleaseError(
        f"release {name!r} was half-created by an earlier try (its {table} commit is in, its release record is "
        f"not) with {first}; this run has {this}. Re-run with the first try's arguments to finish it"
        f"{' (' + fix + ')' if fix else ''}, or choose a new release name")


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


LINEAGE_CHUNK_ROWS = 32_768  # released rows built and written at a time (the lineage table's row groups)


def _id_batches(lake: Lake, table: str, version: int, sample_ids: pa.ChunkedArray | pa.Array | None,
                reason: str | pa.Array | pa.ChunkedArray | None, reason_column: str | None,
                reason_prefix: str, reason_of: Callable[[pa.Array], pa.Array] | None = None
                ) -> Iterator[tuple[pa.Array, pa.Array]]:
    """(ids, reasons) batches: slices of the given arrays, or the frozen version scanned in bounded batches."""
    if sample_ids is not None:
        ids = sample_ids.combine_chunks() if isinstance(sample_ids, pa.ChunkedArray) else sample_ids
        reasons = reason.combine_chunks() if isinstance(reason, pa.ChunkedArray) else reason
        for start in range(0, len(ids), LINEAGE_CHUNK_ROWS):
            part = ids.slice(start, LINEAGE_CHUNK_ROWS)
            yield part, (reasons.slice(start, LINEAGE_CHUNK_ROWS) if isinstance(reasons, pa.Array)
                         else pa.repeat(pa.scalar(reasons, pa.string()), len(part)))
        return
    columns = ["sample_id"] + ([reason_column] if reason_column else [])
    for batch in scan_batches(lake.dataset(table, version), columns=columns, batch_rows=LINEAGE_CHUNK_ROWS):
        ids = batch.column("sample_id")
        if reason_of is not None:
            reasons = reason_of(ids)
        elif reason_column:
            prefix = pa.repeat(pa.scalar(reason_prefix, pa.string()), len(ids))
            reasons = pc.binary_join_element_wise(prefix, batch.column(reason_column).cast(pa.string()), "")
        else:
            reasons = pa.repeat(pa.scalar(reason if isinstance(reason, str) else None, pa.string()), len(ids))
        yield ids, reasons


_ID_ROWS = pa.schema([("sample_id", pa.string()), ("reason_code", pa.int32())])


@dataclass
class _Released:
    """What a pass over the released ids gives: the row count, the digest, the distinct reasons (indexed by the
    ``reason_code`` of the rows) and how many non-null ids went to the sort (``SortedRuns``: the distinct ids in
    order, spilled to local disk in sorted runs past ``RUN_ROWS``, so what is held stays bounded)."""

    rows: int
    digest: int
    ids: int
    reasons: pa.Array


def _collect(batches: Iterator[tuple[pa.Array, pa.Array]], runs: SortedRuns) -> _Released:
    dictionary: dict[str | None, int] = {}
    rows = digest = ids_added = 0
    for ids, reasons in batches:
        rows += len(ids)
        digest += digest_sum(ids)
        valid = pc.is_valid(ids)
        encoded = pc.dictionary_encode(reasons.filter(valid))
        values = encoded.dictionary.to_pylist()
        remap = pa.array([dictionary.setdefault(v, len(dictionary)) for v in values], pa.int32())
        codes = remap.take(encoded.indices) if len(values) else pa.nulls(len(encoded), pa.int32())
        kept = ids.filter(valid).cast(pa.string())
        ids_added += len(kept)
        # the sort is stable and keeps the first row of each id: the reason of its first row
        runs.add(pa.table([kept, pc.fill_null(codes, dictionary.setdefault(None, len(dictionary)))],
                          schema=_ID_ROWS))
    reasons = pa.array(sorted(dictionary, key=dictionary.__getitem__), pa.string())
    return _Released(rows, digest & ((1 << 128) - 1), ids_added, reasons)


def regrouped(blocks: Iterator[pa.Table], rows: int) -> Iterator[pa.Table]:
    """``blocks`` regrouped into tables of exactly ``rows`` rows (the last one shorter)."""
    held: list[pa.Table] = []
    count = 0
    for block in blocks:
        held.append(block)
        count += block.num_rows
        while count >= rows:
            whole = pa.concat_tables(held)
            chunk, rest = whole.slice(0, rows).combine_chunks(), whole.slice(rows)
            held, count = ([rest] if rest.num_rows else []), rest.num_rows
            del whole, rest  # only the rest's blocks stay held while the chunk is in use
            yield chunk
    if count:
        last = pa.concat_tables(held).combine_chunks()
        held = []
        yield last


class _SortedRows:
    """Lineage rows sorted by sample_id (a stream of tables, read once) handed out by ascending upper bounds."""

    def __init__(self, blocks: Iterator[pa.Table]) -> None:
        self._blocks = blocks
        self._held: pa.Table | None = None

    def below(self, bound: pa.Scalar | None, limit: int) -> tuple[pa.Table | None, bool]:
        """Up to ``limit`` of the rows not taken yet whose sample_id is below ``bound`` (no bound when None), and
        whether the limit stopped it (more such rows may be left)."""
        pieces: list[pa.Table] = []
        taken = 0
        while True:
            if self._held is None or not self._held.num_rows:
                self._held = next(self._blocks, None)
                if self._held is None:
                    return (pa.concat_tables(pieces) if pieces else None), False
            if taken == limit:
                return pa.concat_tables(pieces), True
            # sorted: the rows below the bound are a prefix (nulls sort last)
            below = self._held.num_rows if bound is None else (
                pc.sum(pc.less(self._held.column("sample_id"), bound)).as_py() or 0)
            count = min(below, limit - taken)
            pieces.append(self._held.slice(0, count))
            taken += count
            self._held = self._held.slice(count)
            if count < below:
                return pa.concat_tables(pieces), True
            if self._held.num_rows:  # the rows left are at or past ``bound``
                return pa.concat_tables(pieces), False


def _extra_blocks(extra: pa.Table | Iterable[pa.Table | pa.RecordBatch] | None) -> Iterator[pa.Table] | None:
    """``extra_lineage`` as a stream of non-empty ``LINEAGE`` tables sorted by sample_id, or None when empty.

    A table is sorted here (stable: rows of one id keep their order); a stream must come sorted that way."""
    if extra is None:
        return None
    if isinstance(extra, pa.Table):
        blocks: Iterator[pa.Table] = iter([extra.cast(LINEAGE).sort_by([("sample_id", "ascending")])])
    else:
        blocks = (pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in extra)
    rows = (block.cast(LINEAGE) for block in blocks if block.num_rows)
    first = next(rows, None)
    if first is None:
        return None

    def stream() -> Iterator[pa.Table]:
        yield first
        yield from rows

    return stream()


def _noted(ids: pa.Array, reasons: pa.Array, notes: _SortedRows, bound: pa.Scalar | None) -> pa.Array:
    """``reasons`` of the released ``ids`` (sorted, all below ``bound``) with the notes of those ids taken from the
    ``notes`` stream (every note below ``bound``: a note of an id not released is passed over): ``REASON; NOTE``, or
    the note alone where the reason is null."""
    pieces = []
    more = True
    while more:
        rows, more = notes.below(bound, LINEAGE_CHUNK_ROWS)
        if rows is not None and rows.num_rows:
            pieces.append(rows.filter(pc.is_in(rows.column("sample_id"), value_set=ids)))
    if not pieces:
        return reasons
    found = pa.concat_tables(pieces)
    note = pc.take(found.column("note"), pc.index_in(ids, value_set=found.column("sample_id").combine_chunks()))
    return _joined(reasons, note.combine_chunks() if isinstance(note, pa.ChunkedArray) else note)


def _joined(reasons: pa.Array, notes: pa.Array) -> pa.Array:
    """``REASON; NOTE``, the note alone where the reason is null, the reason where the note is."""
    return pc.coalesce(pc.binary_join_element_wise(reasons, notes, "; "), notes, reasons)


def _lineage_chunks(name: str, released: _Released, distinct: Iterator[pa.Table], ts: datetime,
                    extra: Iterator[pa.Table] | None, notes: Iterator[pa.Table] | None = None) -> Iterator[pa.Table]:
    """``released`` lineage rows for the ``distinct`` ids (sorted blocks of sample_id, reason_code), merged with
    the ``extra`` rows (a sorted stream), in sample_id order, ``LINEAGE_CHUNK_ROWS`` released rows at a time with
    the extra rows that fall between their first id and the next chunk's; the ``notes`` (a sorted stream of
    sample_id, note) of a chunk's ids go into their reasons (``_noted``)."""
    cursor = _SortedRows(extra) if extra is not None else None
    noted = _SortedRows(notes) if notes is not None else None
    chunks = regrouped(distinct, LINEAGE_CHUNK_ROWS)
    current = next(chunks, _ID_ROWS.empty_table())
    while current is not None:
        following = next(chunks, None)  # its first id bounds this chunk's share of the extra rows
        ids = current.column("sample_id").combine_chunks()
        bound = following.column("sample_id")[0] if following is not None else None
        reasons = released.reasons.take(current.column("reason_code").combine_chunks())
        if noted is not None:
            reasons = _noted(ids, reasons, noted, bound)
        chunk = lineage_rows(ids, run_id=release_txn(name), op=RELEASE_OP, action="released", reason=reasons,
                             ref=name, ts=ts, sort=False)
        while cursor is not None:
            rows, more = cursor.below(bound, LINEAGE_CHUNK_ROWS)
            if rows is None or not rows.num_rows:
                break
            if not more:  # the chunk's whole share: one chunk, as when the share is small
                chunk = pa.concat_tables([chunk, rows]).sort_by([("sample_id", "ascending")])
                break
            # a large share goes out in pieces: the released rows up to the piece's last id with it (rows of one
            # id: the released row first, then the extra rows in their order, as in the whole sort)
            last = rows.column("sample_id")[-1]
            upto = chunk.num_rows if not last.is_valid else (
                pc.sum(pc.less_equal(chunk.column("sample_id"), last)).as_py() or 0)
            yield pa.concat_tables([chunk.slice(0, upto), rows]).sort_by([("sample_id", "ascending")])
            chunk = chunk.slice(upto)
        if chunk.num_rows:
            yield chunk
        current = following


def freeze(
    lake: Lake,
    name: str,
    *,
    table: str,
    version: int,
    kind: str,
    qa_status: str,
    sample_ids: pa.ChunkedArray | pa.Array | None = None,
    parents: list[str] | None = None,
    run_ids: list[str] | None = None,
    jobs: list[str] | None = None,
    details: dict[str, Any] | None = None,
    creator: str | None = None,
    extra_lineage: pa.Table | Iterable[pa.Table | pa.RecordBatch] | None = None,
    released_reason: pa.Array | pa.ChunkedArray | None = None,
    reason_column: str | None = None,
    reason_prefix: str = "",
    released_reason_of: Callable[[pa.Array], pa.Array] | None = None,
    released_notes: Iterable[pa.Table] | None = None,
    allow_contamination: str | None = None,
    contamination_check: str | None = None,
    evalset_digests: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
    fix: str = "",
    progress: Progress | None = None,
) -> Release:
    """Record ``name`` -> (``table``, ``version``) with its digest and one lineage row per sample.

    The samples are ``sample_ids`` (with ``released_reason`` per row), or when None, the ``sample_id`` column of
    ``table`` at ``version``, scanned in bounded batches (the reason then is ``reason_prefix`` + the row's
    ``reason_column``, or ``released_reason_of(ids)`` per scanned batch, or the release kind). Lineage is written in
    sorted chunks of ``LINEAGE_CHUNK_ROWS``; what is held is bounded: the distinct ids are sorted in runs spilled to
    local disk (``datahub.lake.external_sort``).
    ``released_notes``: a stream of (``sample_id``, ``note``) tables sorted by sample_id, one row per id (e.g.
    ``SortedRuns.merged()``), read once along the released ids: a released row of such an id gets the note in its
    reason (``REASON; NOTE``, or the note alone), e.g. an allowed eval-set contamination (``allow_contamination``,
    recorded with the lineage commit: when an earlier try committed the lineage without it, as an eval set registered
    since then overlaps now, the notes go to the lineage in a commit of their own, ``_late_notes``, one per
    ``contamination_check``: the ``check_key`` of the eval-set check that found them, so samples a check of eval sets
    changed since an earlier try finds are noted too).
    ``extra_lineage`` (e.g. ``dropped`` rows) is merged in by sample_id: a table (sorted here), or a stream of
    tables or record batches already sorted by sample_id (e.g. ``SortedRuns.merged()`` over spilled rows), read
    once, a chunk's share at a time. ``params`` (the command's arguments) are recorded with the lineage commit
    together with the frozen table, version and digest; a re-run after a crash between the lineage and the
    ``releases`` commit that would record other ones is refused, naming ``fix`` (``refuse_other_try``).
    ``progress`` gets the rows of the id pass (``samples``) and the lineage rows written (``lineage``).
    ``evalset_digests``: the eval sets (``name@version`` -> digest) the release's rows were checked against (the
    gates of create, merge and redact; {} when none was registered). The registry is read again right before the
    lineage commit and right before the record's, and the release is refused (``EvalSetsChangedError``, retryable)
    when a set was registered since: the record is the release, and one committed after a registration nobody
    checked its rows against would ship them unchecked. What stays open is the time between that last read and the
    record's commit (one small Delta commit): the two tables have no common transaction, and a set registered in it
    counts as registered after the release.
    """
    # The release is read by time travel: the frozen table must keep its log even when another
    # writer (Spark add-actions, an older datahub) created it without the property.
    lake.keep_log(table)
    ts = datetime.now(timezone.utc)
    txn = release_txn(name)
    default_reason = None if kind == "create" else kind
    with SortedRuns(_ID_ROWS, "sample_id") as runs:
        batches = _id_batches(lake, table, version, sample_ids,
                              released_reason if released_reason is not None else default_reason,
                              reason_column, reason_prefix, released_reason_of)
        total = None
        if progress is not None:  # the bar's end: the given ids, or the rows the Delta log counts
            total = len(sample_ids) if sample_ids is not None else logged_rows(lake, table, version)
        released = _collect(counted(batches, progress, "samples", total=total, rows=lambda batch: len(batch[0])), runs)
        extra = _extra_blocks(extra_lineage)
        frozen = {**(params or {}), "frozen": f"{table}@v{version}", "rows": released.rows,
                  "digest": f"{released.digest:032x}"}
        refuse_other_try(lake, name, "lineage", frozen, fix=fix)  # allow_contamination is compared below
        notes = iter(released_notes) if released_notes is not None else None
        frozen[_ALLOWED] = allow_contamination if notes is not None else None  # what the lineage's notes say
        frozen[_CHECK] = contamination_check if notes is not None else None  # the check they come from
        first = committed_params(lake, "lineage", name)
        written = _written_allowance(lake, name, first)
        if written is not None and written != allow_contamination:
            _refuse_other_allowance(name, written, allow_contamination)
        if first is not None:
            if notes is not None and not _check_noted(lake, name, first, contamination_check):
                # the first try's released rows lack the notes of this check (it found nothing then, or its eval
                # sets have changed since, and may overlap other samples now)
                _late_notes(lake, name, released, runs.merged(), notes, allow_contamination, contamination_check,
                            ts)
        elif released.ids or extra is not None:
            if evalset_digests is not None:  # a set registered while the rows were written: before the lineage
                refuse_evalsets_since(lake, name, evalset_digests, written=True)
            chunks = _lineage_chunks(name, released, runs.merged(), ts, extra, notes)
            commit_rows(lake, "lineage", counted(chunks, progress, "lineage", total=None, rows=len),
                        schema=LINEAGE, txn=txn, row_group_rows=LINEAGE_CHUNK_ROWS,
                        metadata={"datahub.release": name, PARAMS_KEY: params_text(frozen)})
    if run_ids is None or jobs is None:
        found_runs, found_jobs = history_runs(lake, table, version)
        run_ids = found_runs if run_ids is None else run_ids
        jobs = found_jobs if jobs is None else jobs
    row = {
        "name": name,
        "table": table,
        "table_version": version,
        "row_count": released.rows,
        "digest": f"{DIGEST_SCHEME}:{released.digest:032x}",
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
    if evalset_digests is not None:  # ... or while the lineage was: the last read before the record is committed
        refuse_evalsets_since(lake, name, evalset_digests, written=True)
    committed = lake.commit(RELEASES_TABLE, pa.Table.from_pylist([row], RELEASES), txn=txn,
                            metadata={"datahub.release": name})
    if committed is None:  # a concurrent creator of the same name won
        raise ReleaseError(f"release {name!r} was created concurrently by another writer; names are immutable")
    return get_release(lake, name)


_ALLOWED = "allow_contamination"  # in the lineage commit's params: the reason its released notes give, or None
_CHECK = "contamination_check"  # ... and the ``check_key`` of the eval-set check the notes come from
NOTES_TXN_SUFFIX = "#contamination"  # the txn of the notes committed after the released rows (``_late_notes``)


def check_key(evalset_digests: dict[str, str], ngram: int, matcher: int | None) -> str:
    """What identifies an eval-set check of one frozen table: the checked eval sets' content digests, the n-gram
    size and the matcher's version (``operators.decontam.ngrams.MATCHER_VERSION``): the contaminated samples follow
    from them."""
    text = json.dumps({"evalset_digests": evalset_digests, "ngram": ngram, "matcher": matcher}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _notes_txn(name: str, check: str | None) -> str:
    return release_txn(name) + NOTES_TXN_SUFFIX + (f"/{check}" if check else "")


def _check_noted(lake: Lake, name: str, first: dict[str, Any], check: str | None) -> bool:
    """Whether the lineage of release ``name`` already has the notes of eval-set check ``check``: in the released
    rows (``first``, the lineage commit's params) or in a notes commit of that check."""
    if first.get(_ALLOWED) is not None and first.get(_CHECK) == check:
        return True
    return lake.applied("lineage", _notes_txn(name, check))


def _written_allowance(lake: Lake, name: str, first: dict[str, Any] | None) -> str | None:
    """The allowed contamination the lineage of release ``name`` already gives its samples (in the released rows'
    reasons, or in the notes of any check committed after them: each gives the same reason), or None."""
    if first is None:
        return None
    if first.get(_ALLOWED) is not None:
        return str(first[_ALLOWED])
    prefix = release_txn(name) + NOTES_TXN_SUFFIX
    for entry in lake.history("lineage"):
        if str(entry.get("datahub.txn") or "").startswith(prefix):
            recorded = json.loads(entry.get(PARAMS_KEY) or "{}").get(_ALLOWED)
            if recorded is not None:
                return str(recorded)
    return None


def refuse_other_allowance(lake: Lake, name: str, allow_contamination: str | None) -> None:
    """Refuse, before any pass over the rows, a re-run of a half-created release ``name`` whose
    ``allow_contamination`` differs from the reason its lineage already gives (``freeze`` would refuse it only after
    the eval-set check and, for a merge, the whole dedup pass)."""
    written = _written_allowance(lake, name, committed_params(lake, "lineage", name))
    if written is not None and written != allow_contamination:
        _refuse_other_allowance(name, written, allow_contamination)


def _refuse_other_allowance(name: str, first: str, this: str | None) -> None:
    raise ReleaseError(
        f"release {name!r} was half-created by an earlier try whose lineage commit gives its contaminated samples "
        f"allow_contamination={json.dumps(first)}; this run has allow_contamination={json.dumps(this)}. Re-run with "
        f'--allow-contamination "{first}" to finish it (the samples\' lineage says so), or choose a new release name')


def _late_notes(lake: Lake, name: str, released: _Released, distinct: Iterator[pa.Table], notes: Iterator[pa.Table],
                allowed: str | None, check: str | None, ts: datetime) -> None:
    """The notes of the released ids (``_noted``) as ``released`` lineage rows of their own, for a release whose
    lineage an earlier try committed without them (an eval set registered since overlaps it, and the re-run allows
    it): committed rows are never rewritten, so each contaminated sample gets a second ``released`` row of this
    release that says why it went out. Committed once per eval-set check (txn ``release/NAME#contamination/CHECK``,
    with the reason): a sample two checks find gets a row of each (lineage queries de-duplicate releases)."""
    cursor = _SortedRows(notes)

    def rows() -> Iterator[pa.Table]:
        chunks = regrouped(distinct, LINEAGE_CHUNK_ROWS)
        current = next(chunks, None)
        while current is not None:
            following = next(chunks, None)
            ids = current.column("sample_id").combine_chunks()
            bound = following.column("sample_id")[0] if following is not None else None
            notes_of = _noted(ids, pa.nulls(len(ids), pa.string()), cursor, bound)  # null: no note
            noted = pc.is_valid(notes_of)
            if pc.any(noted).as_py():
                reasons = _joined(released.reasons.take(current.column("reason_code").combine_chunks()), notes_of)
                yield lineage_rows(ids.filter(noted), run_id=release_txn(name), op=RELEASE_OP, action="released",
                                   reason=reasons.filter(noted), ref=name, ts=ts, sort=False)
            current = following

    commit_rows(lake, "lineage", rows(), schema=LINEAGE, txn=_notes_txn(name, check),
                row_group_rows=LINEAGE_CHUNK_ROWS,
                metadata={"datahub.release": name, PARAMS_KEY: params_text({_ALLOWED: allowed, _CHECK: check})})


def logged_rows(lake: Lake, table: str, version: int) -> int | None:
    """The rows of ``table`` at ``version`` from the Delta log's add actions (no data file read), or None when a
    writer left a file's count out."""
    counts = lake.table(table, version).get_add_actions(flatten=True).column("num_records").to_pylist()
    return None if any(count is None for count in counts) else int(sum(counts))


def _default_creator() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return "unknown"
