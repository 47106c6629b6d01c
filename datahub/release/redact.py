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
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError
from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.scan import scan_batches
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
# sample ids held at a time as a lookup set (the rest wait in sorted runs on local disk), looked up by pc.index_in in
# calls of as many scanned ids. index_in builds a hash table of the set at every call: ~72 B per 32-hex id, but 200 B
# at exactly a power of two (524,288 ids: 100 MB; 524,287: 36 MB). Measured at 250,000 ids (releases_containing on
# the 4M-row lake of benchmarks/release_scale.py): 38 MB of Arrow memory in all; more ids take more passes instead
PARTITION_IDS = (1 << 18) - 1
_IDS = pa.schema([("sample_id", pa.string())])


def read_ids_file(path: str) -> list[str]:
    """One sample id per line; blank lines and ``#`` comments ignored."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.split("#", 1)[0].strip() for line in handle if line.split("#", 1)[0].strip()]
    except OSError as exc:
        raise ReleaseError(f"--ids-file {path}: cannot read it: {exc.strerror}") from None


class SortedIds:
    """Distinct sample ids in sorted order, gathered in any order and spilled to local disk (sorted runs of at most
    ``run_rows`` ids, merged once into one file), then read back as often as needed, a block at a time: a
    take-down of millions of rows holds one block, not its ids."""

    def __init__(self, *, run_rows: int | None = None) -> None:
        self._runs: SortedRuns | None = SortedRuns(_IDS, "sample_id", run_rows=run_rows,
                                                   read_rows=min(BATCH_ROWS, run_rows or BATCH_ROWS))
        self._directory: str | None = None
        self.count = 0  # distinct ids, known once sealed

    def __enter__(self) -> SortedIds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, ids: pa.Array | pa.ChunkedArray) -> None:
        assert self._runs is not None, "add before seal()"
        ids = ids.drop_null() if ids.null_count else ids
        if len(ids):
            self._runs.add(pa.table([ids.cast(pa.string())], schema=_IDS))

    def seal(self) -> SortedIds:
        """Merge what was added into one sorted file (done once, before reading)."""
        assert self._runs is not None, "sealed twice"
        self._directory = tempfile.mkdtemp(prefix="datahub-ids-")
        weakref.finalize(self, shutil.rmtree, self._directory, True)
        with self._runs, pa.OSFile(self._path, "wb") as sink, pa.ipc.new_file(sink, _IDS) as writer:
            for block in self._runs.merged():
                writer.write_table(block)
                self.count += block.num_rows
        self._runs = None
        return self

    @property
    def _path(self) -> str:
        assert self._directory is not None
        return os.path.join(self._directory, "ids.arrow")

    def blocks(self) -> Iterator[pa.Array]:
        """The ids in order, a spilled block at a time."""
        with pa.OSFile(self._path, "rb") as source:
            reader = pa.ipc.open_file(source)
            for index in range(reader.num_record_batches):
                yield reader.get_batch(index).column(0)

    def chunks(self, ids: int) -> Iterator[pa.Array]:
        """The ids in order, in arrays of ``ids`` (the last one shorter)."""
        held: list[pa.Array] = []
        count = 0
        for block in self.blocks():
            held.append(block)
            count += len(block)
            while count >= ids:
                whole = pa.concat_arrays(held)
                rest = whole.slice(ids)
                # the blocks let go before the chunk is handed out: it is not held twice while in use
                held, count = ([rest] if len(rest) else []), len(rest)
                yield whole.slice(0, ids)
        if count:
            last, held = pa.concat_arrays(held), []
            yield last

    def bounds(self, ids: int) -> list[pa.Scalar]:
        """The first id of each of ``chunks(ids)`` but the first: where each partition's share of the id range
        begins (one read of the file, nothing held but these)."""
        found: list[pa.Scalar] = []
        offset = 0
        for block in self.blocks():
            position = len(found) + 1  # the index of the next partition whose first id is wanted
            while position * ids < offset + len(block):
                found.append(block[position * ids - offset])
                position += 1
            offset += len(block)
        return found

    def close(self) -> None:
        if self._runs is not None:
            self._runs.close()
            self._runs = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def releases_containing(lake: Lake, *, sample_ids: list[str] | pa.Array | SortedIds,
                        source_uri: str | None = None, partition_ids: int = PARTITION_IDS) -> dict[str, int]:
    """release name -> how many of the samples (ids, or rows from ``source_uri``) it holds.

    Each release's ``sample_id`` (and ``source_uri``) is scanned in batches once per partition of at most
    ``partition_ids`` of the (sorted) ids, which is what is held as a lookup set; a release's rows from
    ``source_uri`` whose ids are not among them are counted through spilled sorted runs."""
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
    """How many distinct sample ids of ``release`` are among ``ids`` or on rows from ``source_uri``."""
    dataset = lake.dataset(release.table, release.version)
    by_source = source_uri is not None and "source_uri" in dataset.schema.names
    if ids is None and not by_source:
        return 0
    columns = ["sample_id", "source_uri"] if by_source else ["sample_id"]
    # each partition's share of the (sorted) id range: an id that is in no partition is looked at in one pass only
    highs: list[pa.Scalar | None] = [*ids.bounds(partition_ids), None] if ids is not None else [None]
    partitions: Iterator[pa.Array | None] = ids.chunks(partition_ids) if ids is not None else iter([None])
    seen = 0
    low: pa.Scalar | None = None
    with SortedIds(run_rows=partition_ids) as others:  # rows from source_uri whose id is not among ``ids``
        for partition, high in zip(partitions, highs):
            found = np.zeros(len(partition) if partition is not None else 0, dtype=bool)
            # pc.index_in builds its hash table of the value set at every call (8,192 ids against 250,000:
            # 3.1 s per million rows; 262,144: 0.09 s), once for all chunks of a chunked array: each call gets at
            # least as many ids as the partition holds, as the scan's own batches (not joined into one copy), and
            # the ids alone (source_uri is folded into a mask per batch)
            lookup_rows = max(BATCH_ROWS, len(partition) if partition is not None else 0)
            scan = scan_batches(dataset, columns=columns, batch_rows=BATCH_ROWS)
            for column, from_source in _id_batches(scan, source_uri if by_source else None, lookup_rows):
                position = pc.index_in(column, value_set=partition) if partition is not None else None
                if position is not None:
                    found[pc.drop_null(position).to_numpy()] = True
                if from_source is not None:
                    other = from_source if position is None else pc.and_(from_source, pc.is_null(position))
                    if low is not None:
                        other = pc.and_(other, pc.greater_equal(column, low))
                    if high is not None:
                        other = pc.and_(other, pc.less(column, high))
                    if pc.any(other).as_py():
                        others.add(column.filter(other))
            seen += int(found.sum())
            low = high
        return seen + others.seal().count


def _id_batches(batches: Iterator[pa.RecordBatch], source_uri: str | None, rows: int
                ) -> Iterator[tuple[pa.ChunkedArray, pa.ChunkedArray | None]]:
    """(sample_id, whether the row is from ``source_uri``) of the scanned ``batches``, handed out at least ``rows``
    at a time (the last may be shorter) as chunked arrays of those batches."""
    ids: list[pa.Array] = []
    masks: list[pa.Array] = []
    count = 0
    for batch in batches:
        ids.append(batch.column("sample_id"))
        if source_uri is not None:
            masks.append(pc.fill_null(pc.equal(batch.column("source_uri"), source_uri), False))
        count += batch.num_rows
        if count >= rows:
            yield _id_batch(ids, masks, source_uri)
            ids, masks, count = [], [], 0
    if ids:
        yield _id_batch(ids, masks, source_uri)


def _id_batch(ids: list[pa.Array], masks: list[pa.Array], source_uri: str | None
              ) -> tuple[pa.ChunkedArray, pa.ChunkedArray | None]:
    return (pa.chunked_array(ids, pa.string()),
            pa.chunked_array(masks, pa.bool_()) if source_uri is not None else None)


def _coalesced(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The same rows in batches of at least ``rows`` (the last may be shorter): small files' batches joined."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield _joined(held)
            held, count = [], 0
    if held:
        yield _joined(held)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def redact(
    lake: Lake,
    new: str,
    *,
    source: str,
    reason: str,
    sample_ids: list[str] | None = None,
    source_uri: str | None = None,
    creator: str | None = None,
    partition_ids: int = PARTITION_IDS,
) -> Release:
    """Release ``new`` = release ``source`` minus the given samples (or every sample of ``source_uri``).

    ``details["contained_in"]`` lists every release (old and new) that holds any of them. Two narrow passes over
    ``source`` (ids and ``source_uri``; then whole rows into the new table) and one over each release for
    ``contained_in``; the removed ids are sorted in runs spilled to local disk, and at most ``partition_ids`` of
    them are held as a lookup set at a time, whatever the size of the take-down.
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

    # pass 1 (ids and source_uri only): what goes, sorted and spilled (freeze scans the ids that stay from the new
    # table); the named ids (given or removed) too, for the releases that hold them
    with SortedIds(run_rows=partition_ids) as removed, SortedIds(run_rows=partition_ids) as named:
        named.add(wanted)
        removed_rows = 0
        for batch in scan_batches(dataset, columns=["sample_id", "source_uri"] if has_source else ["sample_id"],
                                  batch_rows=BATCH_ROWS):
            hits = pc.filter(batch.column("sample_id"), target_of(batch))
            removed_rows += len(hits)
            removed.add(hits)
            if ids:  # the named ids: the given ones and the removed ones (no ids given: the removed ones alone)
                named.add(hits)
        if not removed_rows:
            what = f"source {source_uri!r}" if source_uri and not ids else f"{len(ids)} given sample id(s)"
            raise ReleaseError(f"release {source!r} holds none of the {what}; nothing to redact "
                               f"(find where a sample is with: datahub lineage SAMPLE_ID --lake {lake.ref})")
        removed.seal()
        contained_in = releases_containing(lake, sample_ids=named.seal() if ids else removed,
                                           source_uri=source_uri, partition_ids=partition_ids)
        named.close()
        ts = datetime.now(timezone.utc)
        ref = json.dumps({"release": new, "from": source, "reason": reason, "source_uri": source_uri})

        def dropped() -> Iterator[pa.Table]:  # sorted by sample_id, as freeze merges them
            for block in removed.blocks():
                yield lineage_rows(block, run_id=release_txn(new), op=REDACT_OP, action="dropped",
                                   reason=f"redacted: {reason}", ref=ref, ts=ts, sort=False)

        def kept() -> Iterator[pa.Table]:  # pass 2: every column, streamed into the commit
            for batch in scan_batches(dataset, batch_rows=ROW_BATCH_ROWS):
                yield pa.Table.from_batches([batch]).filter(pc.invert(target_of(batch)))

        # written here and committed as add actions: delta-rs's writer buffers up to a target-size file of rows
        commit_rows(lake, table, kept(), txn=release_txn(new), schema=pa.schema(dataset.schema),
                    row_group_rows=ROW_BATCH_ROWS, metadata={"datahub.release": new, "datahub.redact_reason": reason,
                                                             PARAMS_KEY: params_text(params)})
        version = int(lake.table(table).version())
        commit_rows(lake, REDACTED_TABLE, _redacted_rows(removed, new), txn=release_txn(new), schema=REDACTED,
                    row_group_rows=BATCH_ROWS * 8, metadata={"datahub.release": new})
        details = {"reason": reason, "removed": removed_rows, "removed_ids_table": REDACTED_TABLE,
                   "requested_ids": len(ids), "source_uri": source_uri, "contained_in": contained_in}
        return freeze(lake, new, table=table, version=version, kind="redact", qa_status="inherited",
                      parents=[source], creator=creator, details=details, extra_lineage=dropped(),
                      run_ids=list(parent.run_ids), jobs=list(parent.jobs), params=params,
                      fix="the same --from, --reason and samples")


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
