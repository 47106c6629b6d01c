"""Cross-release dedup for ``release.merge`` in bounded memory, reusing the dedup operators' kernels.

The input rows are numbered (``ROW``) across the inputs: ``--from`` order, then scan order. Keep rule in every
mode: the first copy (smallest row number) wins. A sample held by several inputs (the same ``sample_id``) is kept
once and is not a drop: only each id's first row takes part. Ids, keys and rows are sorted in runs spilled to local
disk and merged (``datahub.lake.external_sort.SortedRuns``), so what a mode holds does not grow with the inputs,
except as said below.

- ``exact``: xxh3-128 of the normalized text (``operators.dedup.exact``), as ``exact_dedup``, made batch by batch;
  the distinct rows sorted by (key, row); the first row of a key is kept, the others are its duplicates.
- ``near``: MinHash signatures and LSH band keys of the ``MinhashDedup`` operator (its hasher and banding, so
  merge and pipeline dedup alike), a batch of texts at a time; (band key, row) pairs sorted by key, and each group
  of equal keys links its rows in a union-find over the linked rows only (``_Links``: their row numbers and
  parents, 8 bytes a row; 16 past 2**31 rows), whose roots are the components' smallest rows: the keepers. The texts of the components' members are read again and
  sorted by component, so each candidate's exact shingle Jaccard to its keeper is measured
  (``operators.dedup.verify.JaccardCheck``); with ``verify`` (default) a candidate below the threshold is kept.

The drops are handed to a ``drop`` callback as they are found (a ``Duplicates`` per group of drops: merge spills
their lineage rows to local disk); what stays in memory for ``near``: the union-find of the linked rows and one
cluster id per component, which grow with the near copies, not with the inputs (the drops' row numbers, for the
keep pass, are sorted in spilled runs too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError
from datahub.lake.external_sort import SortedRuns
from datahub.lake.scan import scan_batches
from datahub.progress import Progress, counted

DedupMode = Literal["exact", "near", "none"]
SOURCE_COLUMN = "release_source"
ROW = "_merge_row"  # a row's number across the inputs
ID_BATCH_ROWS = 8192  # ids read at a time
# texts hashed, signed or compared at a time: normalization makes a few copies of a batch (8,192 texts of 5 KB
# peaked at ~630 MB in the exact merge, 2,048 at ~340 MB)
TEXT_BATCH_ROWS = 2048
EDGE_RUN_ROWS = 1 << 20  # (band key, row) pairs sorted in memory at a time: 16 MB
MEMBER_RUN_ROWS = 2048  # whole texts sorted in memory at a time (~10 MB of 5 KB documents)
MEMBER_READ_ROWS = 64  # whole texts read from each spilled run at a time

_KEY = "_merge_key"
_BAND_KEY = "_merge_band_key"
_COMPONENT = "_merge_component"
_IDS = pa.schema([("sample_id", pa.string()), (ROW, pa.int64())])
_KEYED = pa.schema([("sample_id", pa.string()), (ROW, pa.int64()), (_KEY, pa.string())])
_EDGES = pa.schema([(_BAND_KEY, pa.int64()), (ROW, pa.int64())])
_MEMBERS = pa.schema([(_COMPONENT, pa.int64()), (ROW, pa.int64()), ("sample_id", pa.string()), ("text", pa.string())])

Keep = Callable[[np.ndarray, np.ndarray, pa.Array], None]  # (rows, their input's index, their sample ids)
_DROP_ROWS = pa.schema([(ROW, pa.int64())])


@dataclass(frozen=True)
class Duplicates:
    """Rows dropped by a merge dedup (a group of them, as found): one per dropped sample."""

    sample_id: pa.Array
    dup_of: pa.Array
    dup_release: pa.Array
    source: pa.Array  # the input release of the dropped row
    extra: list[dict[str, Any]]  # per-row ref fields of the method (cluster_id, jaccard)
    method: str
    reason: str


Drop = Callable[[Duplicates], None]  # a group of drops, as found


class Inputs:
    """The input releases' datasets read as one numbered row stream; the row counts are known after a first pass."""

    def __init__(self, names: list[str], datasets: list[Any], *, progress: Progress | None = None,
                 total: int | None = None) -> None:
        self.names = names
        self.datasets = datasets
        self.counts: list[int] | None = None
        self.progress = progress  # told the rows read of each pass over the inputs, of ``total``
        self.total = total
        self.passes = 0

    def batches(self, columns: list[str], batch_rows: int | None = None
                ) -> Iterator[tuple[int, int, pa.RecordBatch]]:
        """(input index, number of the first row, batch) over every input, ``columns`` that each input has,
        ``batch_rows`` (default ``ID_BATCH_ROWS``) at a time."""
        self.passes += 1
        return counted(self._batches(columns, batch_rows), self.progress, f"inputs, pass {self.passes}",
                       total=self.total, rows=lambda item: item[2].num_rows)

    def _batches(self, columns: list[str], batch_rows: int | None) -> Iterator[tuple[int, int, pa.RecordBatch]]:
        counts, first = [], 0
        for index, dataset in enumerate(self.datasets):
            names = pa.schema(dataset.schema).names
            seen = 0
            for batch in scan_batches(dataset, columns=[c for c in columns if c in names],
                                      batch_rows=batch_rows or ID_BATCH_ROWS):
                yield index, first + seen, batch
                seen += batch.num_rows
            counts.append(seen)
            first += seen
        self.counts = counts

    @property
    def rows(self) -> int:
        assert self.counts is not None, "read the inputs once first"
        return sum(self.counts)

    def index_of(self, rows: np.ndarray) -> np.ndarray:
        """The input of each row number."""
        assert self.counts is not None, "read the inputs once first"
        return np.searchsorted(np.cumsum(self.counts), rows, side="right")

    def source_of(self, rows: np.ndarray) -> pa.Array:
        return pa.array(self.names, pa.string()).take(pa.array(self.index_of(rows)))


def exact_keys(sample_ids: pa.Array | pa.ChunkedArray, texts: pa.Array | pa.ChunkedArray | None) -> tuple[pa.Array, str]:
    """The exact-dedup key of each row and the method's name (one batch at a time is fine: keys are per row)."""
    try:
        from operators.dedup.exact import content_hash_hex
    except ImportError:  # the dedup library is optional here; sample_id is a content hash too
        texts = None
    if texts is None:
        ids = sample_ids.combine_chunks() if isinstance(sample_ids, pa.ChunkedArray) else sample_ids
        return ids, "sample_id"
    return content_hash_hex(texts), "exact_content_hash"


def _ids(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    ids = batch.column("sample_id")
    if ids.null_count:
        raise ReleaseError("release merge: an input release has rows without a sample_id; every released row "
                           "needs one (check the table the release froze)")
    return ids.cast(pa.string())


def _rows(first: int, count: int) -> pa.Array:
    return pa.array(np.arange(first, first + count, dtype=np.int64))


def _groups(blocks: Iterator[pa.Table], key: str) -> Iterator[tuple[pa.Table, np.ndarray, int]]:
    """Blocks sorted by (``key``, ``ROW``) -> (table, leader, start): ``leader[i]`` is the index in ``table`` of the
    first row of row i's group; rows from ``start`` on are new (a group that goes on past a block has its first
    row carried into the next table, at index 0, with ``start`` 1)."""
    carry: pa.Table | None = None
    for block in blocks:
        if not block.num_rows:
            continue
        table = pa.concat_tables([carry, block]) if carry is not None else block
        keys = table.column(key)
        new_group = np.ones(table.num_rows, dtype=bool)
        if table.num_rows > 1:
            new_group[1:] = pc.not_equal(keys.slice(1), keys.slice(0, table.num_rows - 1)).to_numpy(
                zero_copy_only=False)
        leader = np.maximum.accumulate(np.where(new_group, np.arange(table.num_rows), 0))
        yield table, leader, 1 if carry is not None else 0
        carry = table.slice(int(leader[-1]), 1)


def exact_duplicates(inputs: Inputs, keep: Keep, drop: Drop) -> str:
    """Exact dedup of the inputs: ``keep`` is given the kept rows (in key order), ``drop`` the drops (in key order);
    returns the method's name."""
    method = "sample_id"
    with SortedRuns(_KEYED, "sample_id") as by_id, SortedRuns(_KEYED, _KEY, order=ROW, distinct=False) as by_key:
        for _, first, batch in inputs.batches(["sample_id", "text"], TEXT_BATCH_ROWS):
            key, method = exact_keys(batch.column("sample_id"),
                                     batch.column("text") if "text" in batch.schema.names else None)
            by_id.add(pa.table([_ids(batch), _rows(first, batch.num_rows), key.cast(pa.string())], schema=_KEYED))
        for block in by_id.merged():  # each sample id's first row (rows added in row order)
            by_key.add(block)
        for table, leader, start in _groups(by_key.merged(), _KEY):
            index = np.arange(start, table.num_rows)
            first_of_key = leader[index] == index
            rows = table.column(ROW).to_numpy()
            ids = table.column("sample_id")
            kept = index[first_of_key]
            if len(kept):
                keep(rows[kept], inputs.index_of(rows[kept]), ids.take(pa.array(kept)).combine_chunks())
            dropped = index[~first_of_key]
            if len(dropped):
                drop(_duplicates(inputs, ids.take(pa.array(dropped)).combine_chunks(),
                                 ids.take(pa.array(leader[dropped])).combine_chunks(), rows[leader[dropped]],
                                 rows[dropped], [], method=method, reason="merge_duplicate"))
    return method


def _duplicates(inputs: Inputs, ids: pa.Array, dup_of: pa.Array, keepers: np.ndarray, rows: np.ndarray,
                extra: list[dict[str, Any]], *, method: str, reason: str) -> Duplicates:
    return Duplicates(sample_id=ids, dup_of=dup_of, dup_release=inputs.source_of(keepers),
                      source=inputs.source_of(rows), extra=extra or [{}] * len(ids), method=method, reason=reason)


class RowCursor:
    """Tables sorted by ``ROW`` (a stream read once) handed out by ascending ranges of row numbers."""

    def __init__(self, blocks: Iterator[pa.Table], schema: pa.Schema) -> None:
        self._blocks = blocks
        self._schema = schema
        self._held: pa.Table | None = None

    def take(self, low: int, high: int) -> pa.Table:
        """The rows numbered in [low, high); rows below ``low`` not taken before are skipped."""
        pieces = []
        while True:
            if self._held is None or not self._held.num_rows:
                self._held = next(self._blocks, None)
                if self._held is None:
                    break
            rows = self._held.column(ROW).to_numpy()
            begin, end = np.searchsorted(rows, [low, high])
            if end > begin:
                pieces.append(self._held.slice(int(begin), int(end - begin)))
            self._held = self._held.slice(int(end))
            if self._held.num_rows:  # rows past ``high`` are left: this range is done
                break
        return pa.concat_tables(pieces) if pieces else self._schema.empty_table()


def _union(parent: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Link rows a[i] and b[i]; every tree's root is its smallest row (a parent is never above its child). Writes to
    one parent from several pairs in a step: one wins, the others are linked again in the next step."""
    while len(a):
        root_a, root_b = _find(parent, a), _find(parent, b)
        differ = root_a != root_b
        low, high = np.minimum(root_a[differ], root_b[differ]), np.maximum(root_a[differ], root_b[differ])
        parent[high] = low
        a, b = low, high


def _find(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    root = parent[rows]
    while True:
        up = parent[root]
        if np.array_equal(up, root):
            break
        root = up
    parent[rows] = root  # path compression for the rows asked
    return root


def _roots(parent: np.ndarray) -> np.ndarray:
    while True:
        up = parent[parent]
        if np.array_equal(up, parent):
            return parent
        parent = up


LINK_BATCH_PAIRS = 1 << 20  # linked (row, row) pairs buffered before they join the union-find: 8-16 MB


class _Links:
    """A union-find over the rows that share a band key with another row (every other row is its own component):
    their row numbers held sorted and distinct, parents as positions among them, so what is held grows with the
    linked rows, not with the inputs. Positions keep row order, so a root is its component's smallest row."""

    def __init__(self, dtype: type) -> None:
        self.dtype = dtype
        self.rows: np.ndarray = np.empty(0, dtype=dtype)  # sorted, distinct row numbers
        self.parent: np.ndarray = np.empty(0, dtype=dtype)  # position -> parent position (never above the child)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_pairs = 0

    def link(self, a: np.ndarray, b: np.ndarray) -> None:
        """Rows a[i] and b[i] are in one component."""
        self._pending.append((a.astype(self.dtype), b.astype(self.dtype)))
        self._pending_pairs += len(a)
        if self._pending_pairs >= LINK_BATCH_PAIRS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        a = np.concatenate([p[0] for p in self._pending])
        b = np.concatenate([p[1] for p in self._pending])
        self._pending, self._pending_pairs = [], 0
        rows: np.ndarray = np.union1d(self.rows, np.concatenate([a, b])).astype(self.dtype)
        if len(rows) != len(self.rows):  # new rows: the held ones move to their places among them
            moved: np.ndarray = np.searchsorted(rows, self.rows).astype(self.dtype)
            parent: np.ndarray = np.arange(len(rows), dtype=self.dtype)
            parent[moved] = moved[self.parent]
            self.rows, self.parent = rows, parent
        _union(self.parent, np.searchsorted(self.rows, a).astype(self.dtype),
               np.searchsorted(self.rows, b).astype(self.dtype))

    def components(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, the root row of each): the linked rows, sorted, and their components' smallest rows."""
        self._flush()
        rows, roots = self.rows, self.rows[_roots(self.parent)]
        self.rows = self.parent = np.empty(0, dtype=self.dtype)
        return rows, roots


NEAR_METHOD = "minhash"


def near_duplicates(inputs: Inputs, keep: Keep, drop: Drop, *, threshold: float, verify: bool) -> str:
    """MinHash-LSH dedup of the inputs (see the module docstring): ``keep`` is given the kept rows in row order,
    ``drop`` the drops (by component); returns the method's name."""
    try:
        from operators.dedup.lsh import band_keys
        from operators.dedup.minhash_op import MinhashDedup
        from operators.dedup.params import MinhashDedupParams
        from operators.dedup.verify import ANCHOR, ANCHOR_TEXT, JACCARD, JaccardCheck
    except ImportError as exc:
        raise ReleaseError(f"--dedup near needs the dedup operators (operators.dedup): {exc}; install datahub "
                           "with its operators, or merge with --dedup exact") from None
    try:
        params = MinhashDedupParams(threshold=threshold)
    except ValueError as exc:
        raise ReleaseError(f"--threshold {threshold}: {exc}") from None
    operator = MinhashDedup(params)  # the operator's hasher and banding, so merge and pipeline dedup alike
    minhasher, bands, band_rows = operator.minhasher, operator.bands, operator.rows
    check = JaccardCheck(minhasher.shingler, params.normalization.build(), 0.0)  # threshold 0: every pair measured
    with SortedRuns(_IDS, "sample_id") as by_id, SortedRuns(_IDS, ROW) as distinct, \
            SortedRuns(_IDS, ROW) as distinct_again, SortedRuns(_DROP_ROWS, ROW) as drop_rows, \
            SortedRuns(_EDGES, _BAND_KEY, order=ROW, distinct=False, run_rows=EDGE_RUN_ROWS) as edges:
        for _, first, batch in inputs.batches(["sample_id"]):
            by_id.add(pa.table([_ids(batch), _rows(first, batch.num_rows)], schema=_IDS))
        for block in by_id.merged():  # each sample id's first row, sorted back into row order
            distinct.add(block)
        links = _Links(np.int32 if inputs.rows < 2**31 else np.int64)
        # signatures of the distinct rows, a batch at a time; the band keys' (key, row) pairs sorted by key
        cursor = RowCursor(distinct.merged(), _IDS)
        for _, first, batch in inputs.batches(["sample_id", "text"], TEXT_BATCH_ROWS):
            mine = cursor.take(first, first + batch.num_rows)
            if not mine.num_rows:
                continue
            distinct_again.add(mine)
            rows = mine.column(ROW).to_numpy()
            texts = batch.column("text") if "text" in batch.schema.names else pa.nulls(batch.num_rows, pa.string())
            signatures = minhasher.signatures(texts.take(pa.array(rows - first)))
            nonempty = np.flatnonzero((signatures != minhasher.empty_value).any(axis=1))  # empty texts: no keys
            keys = band_keys(signatures[nonempty], bands, band_rows)
            edges.add(pa.table([pa.array(np.ascontiguousarray(keys, dtype=np.int64).ravel()),
                                pa.array(np.repeat(rows[nonempty], bands))], schema=_EDGES))
        for table, leader, start in _groups(edges.merged(), _BAND_KEY):
            index = np.arange(start, table.num_rows)
            linked = index[leader[index] != index]
            if len(linked):
                rows = table.column(ROW).to_numpy()
                links.link(rows[leader[linked]], rows[linked])
        linked_rows, roots = links.components()
        del links
        # linked rows that are not their component's root: the candidates; members: they and their keepers (roots)
        members = linked_rows[linked_rows != roots].astype(np.int64)
        if len(members):
            members = np.union1d(members, roots[linked_rows != roots]).astype(np.int64)
            member_roots = roots[np.searchsorted(linked_rows, members)].astype(np.int64)

            def dropped(found: Duplicates, rows: np.ndarray) -> None:
                drop(found)
                drop_rows.add(pa.table([pa.array(rows, pa.int64())], schema=_DROP_ROWS))

            _verified(inputs, members, member_roots, check, dropped, threshold=threshold, verify=verify,
                      columns=(ANCHOR, ANCHOR_TEXT, JACCARD))
        del linked_rows, roots
        drops = RowCursor(drop_rows.merged(), _DROP_ROWS)
        for block in distinct_again.merged():
            rows = block.column(ROW).to_numpy()
            if not len(rows):
                continue
            mine = drops.take(int(rows[0]), int(rows[-1]) + 1).column(ROW).to_numpy()
            stays = ~np.isin(rows, mine) if len(mine) else np.ones(len(rows), dtype=bool)
            if stays.any():
                keep(rows[stays], inputs.index_of(rows[stays]), block.column("sample_id").filter(
                    pa.array(stays)).combine_chunks())
    return NEAR_METHOD


def _verified(inputs: Inputs, members: np.ndarray, member_roots: np.ndarray, check: Any,
              dropped: Callable[[Duplicates, np.ndarray], None], *, threshold: float, verify: bool,
              columns: tuple[str, str, str]) -> None:
    """The candidates (``members`` that are not their component's root, ``member_roots``) measured against their
    keepers: the texts of ``members`` read again and sorted by component, so a keeper's text comes just before its
    candidates'.
    ``dropped`` is given each component's drops and their row numbers."""
    anchor, anchor_text, jaccard_column = columns
    smallest: list[pa.Table] = []  # per batch, each component's smallest sample id: the cluster id
    with SortedRuns(_MEMBERS, _COMPONENT, order=ROW, distinct=False, run_rows=MEMBER_RUN_ROWS,
                    read_rows=MEMBER_READ_ROWS) as by_component:
        for _, first, batch in inputs.batches(["sample_id", "text"], TEXT_BATCH_ROWS):
            low, high = np.searchsorted(members, [first, first + batch.num_rows])
            if low == high:
                continue
            rows = members[low:high]
            local = pa.array(rows - first)
            texts = batch.column("text") if "text" in batch.schema.names else pa.nulls(batch.num_rows, pa.string())
            part = pa.table([pa.array(member_roots[low:high]), pa.array(rows), _ids(batch).take(local),
                             texts.take(local)], schema=_MEMBERS)
            by_component.add(part)
            smallest.append(part.group_by(_COMPONENT, use_threads=False).aggregate([("sample_id", "min")]))
        clusters = pa.concat_tables(smallest).group_by(_COMPONENT, use_threads=False).aggregate(
            [("sample_id_min", "min")])
        cluster_of = clusters.column(_COMPONENT).combine_chunks()
        cluster_ids = clusters.column("sample_id_min_min").combine_chunks()
        for table, leader, start in _groups(by_component.merged(), _COMPONENT):
            index = np.arange(start, table.num_rows)
            candidate = index[leader[index] != index]
            if not len(candidate):
                continue
            ids, texts = table.column("sample_id"), table.column("text")
            keeper = pa.array(leader[candidate])
            pairs = pa.table({"sample_id": ids.take(pa.array(candidate)), "text": texts.take(pa.array(candidate)),
                              anchor: ids.take(keeper), anchor_text: texts.take(keeper)})
            jaccard = check(pairs).column(jaccard_column).to_numpy()
            drop = jaccard >= threshold if verify else np.ones(len(candidate), dtype=bool)
            if not drop.any():
                continue
            candidate, jaccard = candidate[drop], jaccard[drop]
            rows = table.column(ROW).to_numpy()
            components = table.column(_COMPONENT).take(pa.array(candidate))
            cluster = cluster_ids.take(pc.index_in(components, value_set=cluster_of))
            extra = [{"cluster_id": c, "jaccard": round(j, 6)} for c, j in zip(cluster.to_pylist(), jaccard.tolist())]
            dropped(_duplicates(inputs, ids.take(pa.array(candidate)).combine_chunks(),
                                ids.take(pa.array(leader[candidate])).combine_chunks(), rows[leader[candidate]],
                                rows[candidate], extra, method=NEAR_METHOD, reason="merge_near_duplicate"),
                    rows[candidate])
