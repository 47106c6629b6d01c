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
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError
from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.progress import Progress, counted
from datahub.release.evalset_gate import (NOTES, NOTHING_TO_CHECK, allowed_of, contamination_notes, no_notes,
                                          not_carried, recorded_clean_checks, refuse_evalsets_since,
                                          registered_digests, rows_done, text_only_rows)
from datahub.release.freeze import (PARAMS_KEY, check_key, freeze, params_text, refuse_other_allowance,
                                    refuse_other_try, refuse_taken, release_txn)
from datahub.release.lookup import (BATCH_ROWS, PARTITION_IDS, ROW_BATCH_ROWS, RangeSplit, SortedIds, add_taken,
                                    rows_kept, taken_row_runs, taken_rows)
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
IDS_FILE_BLOCK = 16 * 2**20  # bytes of an ids file read at a time


def read_ids_file(path: str) -> list[str]:
    """One sample id per line; blank lines and ``#`` comments ignored (``ids_file_chunks`` as one list)."""
    return [sample_id for chunk in ids_file_chunks(path) for sample_id in chunk.to_pylist()]


def ids_file_chunks(path: str, *, block_bytes: int = IDS_FILE_BLOCK) -> Iterator[pa.Array]:
    """The sample ids of an ids file, one per line (lines end at \\n, \\r\\n or \\r, as Python's text files read
    them), each cut at its first ``#`` and stripped of whitespace, blank ones left out: an array per ``block_bytes``
    of the file, so a take-down list of millions of ids is never held whole (nor as Python strings)."""
    try:
        with open(path, "rb") as handle:
            rest, start = b"", 0  # ``start``: where ``data`` begins in the file
            while True:
                block = handle.read(block_bytes)
                data = rest + block
                if block:  # whole lines only (a line ending is one ASCII byte: never inside a UTF-8 character)
                    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
                    data, rest = data[:cut], data[cut:]
                if data:
                    try:
                        text = data.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ReleaseError(f"--ids-file {path}: not UTF-8 text ({exc.reason} at byte "
                                           f"{start + exc.start}); save it as UTF-8, one sample id per line") from None
                    start += len(data)
                    lines = pc.list_flatten(pc.split_pattern_regex(pa.array([text], pa.string()), r"\r\n|\r|\n"))
                    ids = pc.utf8_trim_whitespace(pc.list_element(pc.split_pattern(lines, "#", max_splits=1), 0))
                    yield ids.filter(pc.not_equal(ids, ""))
                if not block:
                    return
    except OSError as exc:
        raise ReleaseError(f"--ids-file {path}: cannot read it: {exc.strerror}") from None


def releases_containing(lake: Lake, *, sample_ids: list[str] | pa.Array | SortedIds,
                        source_uri: str | None = None, partition_ids: int = PARTITION_IDS) -> dict[str, int]:
    """release name -> how many of the samples (ids, or rows from ``source_uri``) it holds.

    Each release's ``sample_id`` (and ``source_uri``) is read once, split by the id ranges of partitions of at most
    ``partition_ids`` of the (sorted) ids, the lookup set held, and each partition looked up in its own rows; a
    release's rows from ``source_uri`` whose ids are not among them are counted through spilled sorted runs."""
    if isinstance(sample_ids, SortedIds):
        given = sample_ids
        count = sample_ids.count
    else:
        given = SortedIds(run_rows=partition_ids)
        given.add(pa.array(sample_ids, pa.string()) if isinstance(sample_ids, list) else sample_ids)
        count = given.seal().count
    try:
        if not count and source_uri is None:
            return {}
        found: dict[str, int] = {}
        for release in list_releases(lake):
            hits = _distinct_hits(lake, release, given if count else None, source_uri, partition_ids)
            if hits:
                found[release.name] = hits
        return found
    finally:
        if given is not sample_ids:
            given.close()


def _distinct_hits(lake: Lake, release: Release, ids: SortedIds | None, source_uri: str | None,
                   partition_ids: int) -> int:
    """How many distinct sample ids of ``release`` are among ``ids`` or on rows from ``source_uri``: one read of its
    ids (and sources), split by the id ranges of the partitions of ``ids`` (``lookup.RangeSplit``)."""
    dataset = lake.dataset(release.table, release.version)
    by_source = source_uri is not None and "source_uri" in dataset.schema.names
    if ids is None and not by_source:
        return 0
    bounds = ids.bounds(partition_ids) if ids is not None else []
    partitions: Iterator[pa.Array | None] = ids.chunks(partition_ids) if ids is not None else iter([None])
    seen = 0
    with SortedIds(run_rows=partition_ids) as others, \
            RangeSplit(dataset, bounds, sources={source_uri: 0} if by_source and source_uri is not None else None
                       ) as split:  # others: rows from source_uri whose id is not among ``ids``
        for index, partition in enumerate(partitions):
            found = np.zeros(len(partition) if partition is not None else 0, dtype=bool)
            # lookup calls of at least as many ids as the partition holds (see ``lookup.taken_rows``)
            lookup_rows = max(BATCH_ROWS, len(partition) if partition is not None else 0)
            for scanned in split.rows(index, lookup_rows=lookup_rows):
                column = scanned.ids
                from_source = pc.is_valid(scanned.by_source) if scanned.by_source is not None else None
                position = pc.index_in(column, value_set=partition) if partition is not None else None
                if position is not None:
                    found[pc.drop_null(position).to_numpy()] = True
                if from_source is not None:
                    other = from_source if position is None else pc.and_(from_source, pc.is_null(position))
                    if pc.any(other).as_py():
                        others.add(column.filter(other))
            seen += int(found.sum())
        return seen + others.seal().count


def redact(
    lake: Lake,
    new: str,
    *,
    source: str,
    reason: str,
    sample_ids: Iterable[str] | None = None,
    ids_files: Sequence[str] = (),
    source_uri: str | None = None,
    creator: str | None = None,
    allow_contamination: str | None = None,
    partition_ids: int = PARTITION_IDS,
    progress: Progress | None = None,
) -> Release:
    """Release ``new`` = release ``source`` minus the given samples (``sample_ids``, the ids in ``ids_files``: see
    ``ids_file_chunks``) or every sample of ``source_uri``.

    ``details["contained_in"]`` lists every release (old and new) that holds any of them. The given ids are sorted in
    runs spilled to local disk; ``source``'s ids (and ``source_uri``) are read once, split by the id ranges of
    partitions of at most ``partition_ids`` given ids (the lookup set held), and each partition is looked up in its
    own rows (``datahub.release.lookup``); the rows that go are spilled (their ids, sorted, and row numbers), then
    whole rows that stay are written to the new table; each release is read for ``contained_in`` the same way.
    Nothing per given id or per removed row is held, whatever the take-down's size. ``progress(stage, done, total)``
    gets the rows found to remove, the eval-set check's, the rows written, then ``freeze``'s.

    A redact is a new release, so it passes ``release create``'s eval-set gate before its rows are written: the rows
    that stay are checked against the eval sets registered now (one registered since ``source`` was released is
    caught), and an overlap refuses it unless ``allow_contamination`` gives the reason (recorded in
    ``details["contamination"]`` and in each contaminated sample's ``released`` lineage reason). A clean check of
    ``source``'s rows against the same eval-set contents, n-gram size and matcher is taken instead of reading them
    again (``recorded_by``, ``reused_check_of``). When ``source`` was itself released with allowed contamination
    against exactly the eval sets registered now, the reason carries over to the samples that stay
    (``carried_from``), as no new overlap is possible then. Both are decided when the check runs, and a carried reason
    is kept only when the check read the very eval-set contents and matcher the parent's reason was given for; an
    eval set registered while the check reads refuses the redact before its rows are written, one registered while
    they are written refuses it before its record is committed (``freeze``; run it again in both cases).
    """
    check_name(new)
    if allow_contamination is not None and not allow_contamination.strip():
        raise ReleaseError("--allow-contamination needs a reason (it is recorded in the release), e.g. "
                           '--allow-contamination "eval set is the held-out split, not the one we score on"')
    if not reason or not reason.strip():
        raise ReleaseError("redact needs --reason TEXT (e.g. 'copyright take-down request #123'); it is recorded in "
                           "lineage")
    with SortedIds(run_rows=partition_ids) as given:
        if sample_ids is not None:
            given.add(pa.array(sample_ids if isinstance(sample_ids, list) else list(sample_ids), pa.string()))
        for path in ids_files:
            for chunk in ids_file_chunks(path):
                given.add(chunk)
        count = given.seal().count
        if not count and source_uri is None:
            if ids_files:  # given, but empty: the generic "needs what to remove" would name what was given
                raise ReleaseError(f"--ids-file {', '.join(ids_files)}: holds no sample ids (only blank lines or "
                                   "# comments); put one sample id per line (the 32 hex digits of a row's sample_id), "
                                   "or remove by --sample ID or --source URI")
            raise ReleaseError("redact needs what to remove: --sample ID (repeatable), --ids-file F or --source URI")
        refuse_taken(lake, new)
        params = {"kind": "redact", "source": source, "reason": reason, "source_uri": source_uri,
                  "sample_ids": f"{count} ids, sha256 {_ids_sha256(given)[:16]}"}
        table = MATERIALIZED_PREFIX + new
        refuse_other_try(lake, new, table, params, fix="the same --from, --reason and samples")
        parent = get_release(lake, source)
        dataset = lake.dataset(parent.table, parent.version)
        if source_uri is not None and "source_uri" not in dataset.schema.names:
            raise ReleaseError(f"release {source!r} has no source_uri column; redact it by --sample ID instead")
        # what the gate decides (reuse, carry) is decided again from the eval sets registered when it runs
        # (``_contamination_gate``); here only to refuse another try's allowance before any pass over the rows
        allowed = allow_contamination if allow_contamination is not None else allowed_of(
            parent, registered_digests(lake), text_only=text_only_rows(lake, parent))
        refuse_other_allowance(lake, new, allowed)  # before any pass over the rows, as create and merge do

        # pass 1 (ids and source_uri only): what goes, its ids sorted and spilled (freeze scans the ids that stay
        # from the new table) and its row numbers; the named ids (given, and removed by source) for the releases
        # that hold them
        with SortedIds(run_rows=partition_ids) as removed, SortedIds(run_rows=partition_ids) as named, \
                taken_row_runs() as gone, taken_row_runs() as gone_checked, SortedRuns(NOTES, "sample_id") as notes:
            removed_rows = 0
            hits = taken_rows(dataset, given, partition_ids=partition_ids,
                               sources={source_uri: 0} if source_uri is not None else None)
            for taken in counted(hits, progress, "find the rows to remove", total=None,
                                 rows=lambda taken: len(taken.ids)):
                removed_rows += len(taken.ids)
                removed.add(taken.ids)
                add_taken(gone, taken)
                # the eval-set check reads the rows that stay once, the write once more; kept whether or not an eval
                # set is registered now, as one registered during this pass is checked too (8 bytes a row, spilled)
                add_taken(gone_checked, taken)
                if count and source_uri is not None:
                    named.add(taken.ids)
            if not removed_rows:
                what = f"source {source_uri!r}" if source_uri and not count else f"{count} given sample id(s)"
                raise ReleaseError(f"release {source!r} holds none of the {what}; nothing to redact "
                                   f"(find where a sample is with: datahub lineage SAMPLE_ID --lake {lake.ref})")
            removed.seal()
            # the eval-set gate, before contained_in reads every release of the lake: a refusal costs one pass less
            kept_rows = parent.row_count - removed_rows
            from operators.decontam.views import matched_columns  # with the check, not with the package

            checked = _contamination_gate(
                lake, new, parent, allow_contamination=allow_contamination, notes=notes, kept_rows=kept_rows,
                kept=lambda: rows_kept(dataset, gone_checked, columns=matched_columns(dataset.schema.names)),
                progress=progress)
            if allow_contamination is None:  # the parent's reason, when it carried over
                allowed = checked.get("allowed") if checked is not None else None
            if count and source_uri is not None:  # the given ids and the rows from the source
                for block in given.blocks():
                    named.add(block)
                named.seal()
            # ids alone: the removed ones are among the given ones; a source alone: the removed ones are the named
            contained_in = releases_containing(
                lake, sample_ids=(named if source_uri is not None else given) if count else removed,
                source_uri=source_uri, partition_ids=partition_ids)
            named.close()
            ts = datetime.now(timezone.utc)
            ref = json.dumps({"release": new, "from": source, "reason": reason, "source_uri": source_uri})

            def dropped() -> Iterator[pa.Table]:  # sorted by sample_id, as freeze merges them
                for block in removed.blocks():
                    yield lineage_rows(block, run_id=release_txn(new), op=REDACT_OP, action="dropped",
                                       reason=f"redacted: {reason}", ref=ref, ts=ts, sort=False)

            # one registered since the check (or during contained_in's reads)
            _refuse_evalsets_since(lake, new, checked)

            # pass 2: every column of the rows that stay, streamed into the commit; written here and committed as add
            # actions: delta-rs's writer buffers up to a target-size file of rows
            kept = counted(rows_kept(dataset, gone), progress, "write", total=kept_rows, rows=len)
            commit_rows(lake, table, kept, txn=release_txn(new), schema=pa.schema(dataset.schema),
                        row_group_rows=ROW_BATCH_ROWS, metadata={"datahub.release": new,
                                                                 "datahub.redact_reason": reason,
                                                                 PARAMS_KEY: params_text(params)})
            version = int(lake.table(table).version())
            commit_rows(lake, REDACTED_TABLE, _redacted_rows(removed, new), txn=release_txn(new), schema=REDACTED,
                        row_group_rows=BATCH_ROWS * 8, metadata={"datahub.release": new})
            details: dict[str, Any] = {"reason": reason, "removed": removed_rows, "removed_ids_table": REDACTED_TABLE,
                                       "requested_ids": count, "source_uri": source_uri, "contained_in": contained_in}
            if checked is None:  # nothing to check against (``evalset_gate.evalset_verdict`` says so, not "too old")
                details["evalset_gate"] = NOTHING_TO_CHECK
            else:
                # the check read (or covers) exactly the rows of this table version: a later merge or redact of this
                # release may take it (``evalset_gate.recorded_clean_checks``)
                details["contamination"] = {**checked, "table": table, "version": version}
            contaminated = checked is not None and bool(checked["contaminated"])
            return freeze(lake, new, table=table, version=version, kind="redact", qa_status="inherited",
                          parents=[source], creator=creator, details=details, extra_lineage=dropped(),
                          released_notes=notes.merged() if contaminated else None,
                          allow_contamination=allowed,
                          contamination_check=None if checked is None else check_key(
                              checked["evalset_digests"], checked["ngram"], checked["matcher"]),
                          run_ids=list(parent.run_ids), jobs=list(parent.jobs), params=params,
                          fix="the same --from, --reason and samples", evalset_digests=_checked_against(checked),
                          progress=progress)


def _contamination_gate(lake: Lake, new: str, parent: Release, *, allow_contamination: str | None,
                        notes: SortedRuns, kept_rows: int, kept: Callable[[], Iterator[pa.Table]],
                        progress: Progress | None) -> dict[str, Any] | None:
    """``release create``'s eval-set check of the rows of ``parent`` that the redact keeps (``kept()``): refused on any
    overlap unless ``allow_contamination``, or the parent's own reason (``evalset_gate.allowed_of``: carried), gives
    the reason; the contaminated samples' notes stream into ``notes``. What to record in ``details["contamination"]``
    (None when no eval set is registered, or none has an item, as create records nothing then).

    Whether the parent's clean check is reused or its reason carried is decided here, from the eval sets registered
    now, not when the redact started: a set registered while the rows to remove were found is checked. A carried
    reason is kept only when the check read exactly the eval-set contents (and matcher) the parent was checked
    against: a set registered between that decision and the check's index is not let out under the parent's reason,
    which was given for other sets."""
    registered = registered_digests(lake)
    if not registered:
        return None
    reused = recorded_clean_checks(lake, [parent], registered).get(parent.name)
    if reused is not None:
        # A redact only removes rows: every row it keeps is a row of ``parent``, unchanged. A clean check of all of
        # parent's rows (same table version, row count and digest of sample ids) against the same eval-set contents,
        # n-gram size and matcher version as now (what recorded_clean_checks compares) matched none of them, and
        # matching is per row, so a check of the kept rows now would match none either: reading them again buys
        # nothing. Any change to what the check depends on (an eval set added or changed, another matcher) fails
        # that comparison and the kept rows are read.
        record = {k: v for k, v in reused.items() if k != "digest"}
        return {**record, "rows_checked": kept_rows, "by_evalset": {}, "contaminated": 0, "allowed": None,
                "reused_check_of": parent.name}
    from datahub.evalset.check import contamination

    text_only = text_only_rows(lake, parent)
    carried = allowed_of(parent, registered, text_only=text_only) if allow_contamination is None else None
    allowed = allow_contamination if allow_contamination is not None else carried
    checked = rows_done(progress, "eval-set check", kept_rows) if progress else None
    found = contamination(lake, table=parent.table, version=parent.version, rows=kept(), progress=checked,
                          hits=contamination_notes(notes, allowed) if allowed is not None else no_notes)
    if not found.evalsets:  # the sets registered hold no item: nothing was checked, as create records nothing
        return None
    if carried is not None and allowed_of(parent, found.evalset_digests, text_only=text_only) is None:
        carried = allowed = None  # the check read other eval sets than the parent's reason was given for
    if found.count and allowed is None:
        parent_reason = not_carried(parent, found.evalset_digests, text_only=text_only)
        raise ReleaseError(
            f"release {new!r} refused: in the rows of release {parent.name!r} that the redact keeps, "
            f"{found.describe()}\n"
            + (f"{parent_reason}\n" if parent_reason else "")
            + "a redact is a new release and must not leak an eval set: take them down too (every id, to the file "
            f"IDS: `datahub evalset check --release {parent.name} --ids-out IDS --lake {lake.ref}`, then add "
            "--ids-file IDS to this redact), or "
            'redact anyway with --allow-contamination "REASON" (recorded in the release and its lineage)')
    record = {**found.as_dict(), "allowed": allowed if found.count else None, "checked_rows_of": parent.name}
    if found.count and carried is not None:
        record["carried_from"] = parent.name  # the parent's allowance, against the same eval sets
    return record


def _refuse_evalsets_since(lake: Lake, new: str, checked: dict[str, Any] | None) -> None:
    """Refuse release ``new`` before its rows are written when the eval sets registered now are not those its rows
    were checked against (``checked``; None: none): one was registered while they were checked, or since. (One
    registered while they are written is refused by ``freeze``, before the lineage and before the record.)"""
    refuse_evalsets_since(lake, new, _checked_against(checked))


def _checked_against(checked: dict[str, Any] | None) -> dict[str, str]:
    """``name@version`` -> digest of the eval sets the gate's check (``checked``; None: none registered) read."""
    return dict((checked or {}).get("evalset_digests") or {})


def _ids_sha256(ids: SortedIds) -> str:
    """sha256 of the sorted ids joined by newlines (what a take-down's params name), read a block at a time."""
    digest = hashlib.sha256()
    first = True
    for block in ids.blocks():
        if not len(block):
            continue
        lines = pc.binary_join_element_wise(block, pa.scalar(""), "\n")  # each id and a newline
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
        joined = memoryview(lines.buffers()[2])[int(offsets[0]):int(offsets[-1]) - 1]  # all but the last newline
        if not first:
            digest.update(b"\n")
        digest.update(joined)
        first = False
    return digest.hexdigest()


def _redacted_rows(ids: SortedIds, release: str) -> Iterator[pa.Table]:
    for chunk in ids.chunks(BATCH_ROWS * 8):
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
