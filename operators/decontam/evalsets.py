"""The ``evalsets`` lake table as decontamination reads it: its schema and the latest version of each set.

``datahub.evalset`` writes it (``datahub evalset add NAME PATH``); it sits in the operator layer so the
``decontaminate`` operator (below the release layer) and the release gate (above it) read one definition.
One row per item per version: adding a set again with other content appends a new version; a version's rows
are never rewritten, so a release's ``evalset@version:item`` references stay resolvable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import LakeError
from datahub.lake.scan import scan_batches
from datahub.retry import retry_policy, storage_errors
from operators.decontam.ngrams import DEFAULT_NGRAM, NgramHasher, NgramIndex

if TYPE_CHECKING:
    from datahub.lake.lake import Lake

EVALSETS_TABLE = "evalsets"

EVALSETS = pa.schema(
    [
        ("evalset", pa.string()),  # the set's name, e.g. mmlu
        ("version", pa.int64()),  # 1, 2, ... per name
        ("item_id", pa.string()),  # the record's id field, else its 0-based line number
        ("prompt", pa.string()),
        ("answer", pa.string()),
        ("text", pa.string()),  # what n-grams are taken from: prompt and answer, one newline between
        ("item_hash", pa.string()),  # sample_id-style content hash of text (lineage rows use it)
        ("source_uri", pa.string()),
        ("digest", pa.string()),  # of the whole version: same content, same digest (a re-add is a no-op)
        ("added", pa.timestamp("us", tz="UTC")),
    ]
)


def item_ref(evalset: str, version: int, item_id: str) -> str:
    """The lineage ``ref`` of a contaminated sample: ``evalset@version:item``."""
    return f"{evalset}@{version}:{item_id}"


def latest_items(lake: Lake, names: Sequence[str] | None = None, *,
                 columns: Sequence[str] = ("evalset", "version", "item_id", "text")) -> pa.Table:
    """Rows of the latest version of each registered eval set (or of ``names`` only; an unknown name is an error)."""
    if not lake.exists(EVALSETS_TABLE):
        if names:
            raise LakeError(f"eval set(s) {', '.join(names)} not registered in lake {lake.root}: no {EVALSETS_TABLE!r} "
                            "table yet; register one with: datahub evalset add NAME PATH --lake " + lake.ref)
        return EVALSETS.empty_table().select(list(columns))
    versions = lake.read(EVALSETS_TABLE, columns=["evalset", "version"])
    latest = versions.group_by("evalset").aggregate([("version", "max")])
    known = latest.column("evalset").to_pylist()
    if names:
        missing = [n for n in names if n not in known]
        if missing:
            raise LakeError(f"eval set(s) {', '.join(missing)} not registered in lake {lake.root} (registered: "
                            f"{', '.join(sorted(known)) or 'none'}); add with: datahub evalset add NAME PATH --lake {lake.ref}")
        latest = latest.filter(pc.is_in(latest.column("evalset"), pa.array(list(names), pa.string())))
    pairs = zip(latest.column("evalset").to_pylist(), latest.column("version_max").to_pylist())
    expression = None
    for name, version in sorted(pairs):
        term = (pc.field("evalset") == name) & (pc.field("version") == version)
        expression = term if expression is None else expression | term
    if expression is None:
        return EVALSETS.empty_table().select(list(columns))
    rows = lake.read(EVALSETS_TABLE, columns=list(dict.fromkeys([*columns, "evalset", "version", "item_id"])),
                     filters=expression)
    return rows.sort_by([("evalset", "ascending"), ("version", "ascending"), ("item_id", "ascending")]).select(list(columns))


INDEX_BATCH_ROWS = 4096  # eval items hashed at a time (~2 MB of text at 500 bytes an item)
# rows of a Parquet row group of the table (``datahub evalset add``): a reader decodes a row group's text column at
# once, so one row group of a whole large set held its text whole again (a 40k-item set: 16 MB of Arrow, not 3 MB)
ROW_GROUP_ROWS = INDEX_BATCH_ROWS


def load_index(lake: Lake, names: Sequence[str] | None = None, *, ngram: int = DEFAULT_NGRAM,
               batch_rows: int = INDEX_BATCH_ROWS) -> NgramIndex:
    """The n-gram index of the latest version of every registered eval set (or of ``names``).

    Streamed: one snapshot of the table is read twice in ``batch_rows`` batches (``scan_batches``), first its
    ``evalset`` and ``version`` (which version is the latest), then the latest versions' ``item_id`` and ``text``; each
    batch's n-grams are hashed and de-duplicated as it comes. What is held is the index's own size: the item refs,
    each batch's distinct (n-gram, item) pairs until the final merge (about the index's 12 bytes an n-gram; eval items
    share few n-grams), and one batch of text, never the table's text. A shared n-gram names the first item in
    (set, version, item id) order, as a whole-table build did."""
    if not lake.exists(EVALSETS_TABLE):
        latest_items(lake, names)  # the error for names asked for (none registered), else nothing to index
        return NgramIndex.build(pa.array([], pa.string()), [], ngram=ngram)
    dataset = lake.dataset(EVALSETS_TABLE, int(lake.table(EVALSETS_TABLE).version()))  # one snapshot, both passes
    where = f"read {lake.table_uri(EVALSETS_TABLE)}"

    def versions() -> dict[str, int]:  # a broken read starts again (Lake.read's retries)
        latest: dict[str, int] = {}
        with storage_errors(where):
            for batch in scan_batches(dataset, columns=["evalset", "version"], batch_rows=batch_rows * 16):
                grouped = pa.Table.from_batches([batch]).group_by("evalset").aggregate([("version", "max")])
                for name, version in zip(grouped.column("evalset").to_pylist(),
                                         grouped.column("version_max").to_pylist()):
                    if name is not None and version is not None and version > latest.get(name, -1):
                        latest[name] = int(version)
        return latest

    latest = retry_policy(versions, lake.retry)
    if names:
        missing = [n for n in names if n not in latest]
        if missing:
            raise LakeError(f"eval set(s) {', '.join(missing)} not registered in lake {lake.root} (registered: "
                            f"{', '.join(sorted(latest)) or 'none'}); add with: datahub evalset add NAME PATH "
                            f"--lake {lake.ref}")
        latest = {n: v for n, v in latest.items() if n in names}
    keys = pa.array([f"{n}@{v}" for n, v in sorted(latest.items())], pa.string())
    hasher = NgramHasher(ngram)

    def hashed() -> tuple[list[pa.Array], list[pa.Array], list[tuple[np.ndarray, np.ndarray]], int]:
        """The latest items' set names and ids, and per batch its distinct (n-gram hash, item in read order)."""
        sets: list[pa.Array] = []
        ids: list[pa.Array] = []
        pairs: list[tuple[np.ndarray, np.ndarray]] = []
        items = 0
        with storage_errors(where):
            for batch in scan_batches(dataset, columns=["evalset", "version", "item_id", "text"],
                                      batch_rows=batch_rows):
                key = pc.binary_join_element_wise(batch.column("evalset"),
                                                  pc.cast(batch.column("version"), pa.string()), "@")
                rows = pa.Table.from_batches([batch]).filter(pc.is_in(key, value_set=keys))
                if not rows.num_rows:
                    continue
                sets.append(rows.column("evalset").combine_chunks())
                ids.append(rows.column("item_id").combine_chunks())
                hashes, offsets = hasher(rows.column("text"))
                owners = np.repeat(np.arange(items, items + rows.num_rows, dtype=np.int32), np.diff(offsets))
                order = np.lexsort((owners, hashes))
                hashes, owners = hashes[order], owners[order]
                distinct = np.ones(len(hashes), dtype=bool)
                distinct[1:] = (hashes[1:] != hashes[:-1]) | (owners[1:] != owners[:-1])
                pairs.append((hashes[distinct], owners[distinct]))
                items += rows.num_rows
        return sets, ids, pairs, items

    sets, ids, pairs, items = retry_policy(hashed, lake.retry)
    if not items:
        return NgramIndex.build(pa.array([], pa.string()), [], ngram=ngram)
    # items in (set, version, item id) order: the refs, and each item's place in it (its rank)
    listed = pa.table({"evalset": pa.concat_arrays(sets), "item_id": pa.concat_arrays(ids)})
    del sets, ids
    order = pc.sort_indices(listed, sort_keys=[("evalset", "ascending"), ("item_id", "ascending")]).to_numpy()
    rank = np.empty(items, np.int32)
    rank[order] = np.arange(items, dtype=np.int32)
    ordered = listed.take(pa.array(order))
    refs = [item_ref(e, latest[e], i) for e, i in zip(ordered.column("evalset").to_pylist(),
                                                      ordered.column("item_id").to_pylist())]
    del listed, ordered, order
    hashes = np.concatenate([h for h, _ in pairs])
    owners = np.concatenate([o for _, o in pairs])
    del pairs
    owners = rank[owners]
    del rank
    order = np.argsort(hashes, kind="stable")
    hashes = hashes[order]
    owners = owners[order]
    del order
    starts = np.flatnonzero(np.concatenate([[True], hashes[1:] != hashes[:-1]])) if len(hashes) else np.empty(0, int)
    # per n-gram its first item in ref order (the smallest rank among the items holding it)
    return NgramIndex(ngram, hashes[starts], np.minimum.reduceat(owners, starts).astype(np.int32), refs,
                      _hasher=hasher)
