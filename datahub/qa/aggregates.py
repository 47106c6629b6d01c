"""Expectations evaluated from aggregates streamed over a table version, in bounded memory.

The table is read once, in batches, and only the columns the suite names (``text`` for the derived
``text_length``/``text_id``, ``quality`` for ``quality_<signal>``). Per expectation type:

| expectation | computed from | memory |
|---|---|---|
| expect_table_row_count_to_be_between | row count | O(1) |
| expect_column_values_to_not_be_null | null and row counts | O(1) |
| expect_column_values_to_be_between | non-null count, count outside the range, 20 examples | O(1) |
| expect_column_values_to_be_in_set | non-null count, count outside the set, 20 examples | O(1) |
| expect_column_mean_to_be_between | sum and count of non-null values | O(1) |
| expect_column_values_to_be_unique | 64-bit hash per non-null value, then counts per hash | bounded (below) |
| expect_column_proportion_of_unique_values_to_be_between | the same hashes | bounded (below) |
| any other type | Great Expectations on a bounded sample (every k-th row, at most ``SAMPLE_ROWS``); exact when the table has no more rows | the sample |

A failed ``not_null``, ``between`` or ``in_set`` check also names the ``sample_id`` of its first ``EXAMPLES``
unexpected rows, in scan order (the version's files as its Delta snapshot lists them, rows in file order;
``example_ids``; the entry's ``unexpected_sample_ids``), when the table has that
column: GX's ``partial_unexpected_list`` of ``chosen_equals_rejected`` is ``[True, ...]``, which says nothing of
which pair to fix. On Spark (``datahub.qa.engine``) one aggregate over the rows' scan positions (``min_by``
with a limit) names the same ids. Rows whose ``sample_id`` is null have no id to
name: they are counted (``unexpected_without_id``; the entry's ``unexpected_rows_without_sample_id``); a check on
``sample_id`` itself names none.

A uniqueness check holds up to ``HELD_HASHES`` hashes (8 MB); past that they are counted per hash and spilled to
local disk in sorted runs (``datahub.lake.external_sort``), merged when the check is judged.

On Ray (``datahub.qa.engine``) each task computes these aggregates for one data file and the driver merges them
(``Check.merge``: counts and sums add, examples in file order, hash lists join), so the verdicts are the local ones.

The verdicts and observed values follow Great Expectations 1.x's own definitions (``unexpected_percent`` of the
non-null values, ``mostly`` against it; ``unique``: every row of a repeated value is unexpected); a test runs both
on the same frames. Hashes: ids and short strings by FNV-1a 64 (vectorized, ``datahub.qa.aggregates``), ``text``
by blake2b-64 per value (no vectorized string hash in pyarrow; about 1 s per GB here); two distinct values share a
hash with probability about n^2 / 2^65 (1e-8 at 10^5 rows), which can only hide a duplicate, never invent one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.external_sort import SortedRuns

SAMPLE_ROWS = 100_000
ID_COLUMN = "sample_id"
# types whose unexpected rows are named by sample_id (``example_ids``): which chat or pair to fix or redact
ID_TYPES = frozenset({"expect_column_values_to_not_be_null", "expect_column_values_to_be_between",
                      "expect_column_values_to_be_in_set"})
HELD_HASHES = 1 << 20  # hashes a uniqueness check holds before counting and spilling them (8 MB)
_HASH_COUNTS = pa.schema([("hash", pa.uint64()), ("count", pa.int64())])
EXAMPLES = 20
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_SHORT = 256  # strings up to this many bytes are hashed vectorized

EXACT_TYPES = frozenset({
    "expect_table_row_count_to_be_between", "expect_column_values_to_not_be_null",
    "expect_column_values_to_be_between", "expect_column_values_to_be_in_set", "expect_column_mean_to_be_between",
    "expect_column_values_to_be_unique", "expect_column_proportion_of_unique_values_to_be_between",
})


def value_hashes(values: pa.Array) -> np.ndarray:
    """uint64 per (non-null) value: integers as they are, floats by their bits, strings up to ``_SHORT`` bytes by
    FNV-1a 64, longer ones by blake2b-64. The function is chosen per value, never per batch, so a value has one hash
    whatever batch or file it sits in (duplicates across batches are found)."""
    if pa.types.is_integer(values.type) or pa.types.is_boolean(values.type):
        return np.asarray(pc.cast(values, pa.int64()), dtype=np.int64).view(np.uint64)
    if pa.types.is_floating(values.type):
        numbers = np.asarray(pc.cast(values, pa.float64()), dtype=np.float64)
        return (numbers + 0.0).view(np.uint64)  # + 0.0: -0.0 and 0.0 are one value
    binary = pc.cast(values, pa.large_binary())
    lengths = np.asarray(pc.binary_length(binary), dtype=np.int64)
    hashes = np.full(len(binary), _FNV_OFFSET, dtype=np.uint64)
    if not len(binary):
        return hashes
    long = lengths > _SHORT
    short = np.flatnonzero(~long)
    if len(short):
        offsets = np.frombuffer(binary.buffers()[1], dtype=np.int64)[binary.offset:binary.offset + len(binary) + 1]
        data = (np.frombuffer(binary.buffers()[2], dtype=np.uint8) if binary.buffers()[2] is not None
                else np.zeros(1, np.uint8))
        begins, short_lengths = offsets[:-1][short], lengths[short]
        folded = hashes[short]
        for column in range(int(short_lengths.max())):
            active = np.flatnonzero(short_lengths > column)
            folded[active] = (folded[active] ^ data[begins[active] + column]) * _FNV_PRIME
        hashes[short] = folded ^ short_lengths.astype(np.uint64)  # the length tells "a" from "a\0"
    if long.any():
        chosen = np.flatnonzero(long)
        hashes[chosen] = np.fromiter(
            (int.from_bytes(hashlib.blake2b(v, digest_size=8).digest(), "little")
             for v in pc.take(binary, pa.array(chosen)).to_pylist()), dtype=np.uint64, count=len(chosen))
    return hashes


@dataclass
class Check:
    """One expectation's running aggregates."""

    expectation: dict[str, Any]
    rows: int = 0
    nonnull: int = 0
    unexpected: int = 0
    total: float = 0.0
    examples: list[Any] = field(default_factory=list)
    example_ids: list[str] = field(default_factory=list)  # sample_id of the unexpected rows, first EXAMPLES
    unexpected_without_id: int = 0  # unexpected rows whose sample_id is null (nothing to name)
    hashes: list[np.ndarray] = field(default_factory=list)
    hash_counts: tuple[int, int, int] | None = None  # (distinct, hashed rows, rows of repeated values), engine-counted
    spilled: SortedRuns | None = field(default=None, repr=False, compare=False)  # (hash, count) past HELD_HASHES
    error: str | None = None  # the kwargs do not fit the column's type: the check fails with this, the rest go on

    @property
    def kind(self) -> str:
        return str(self.expectation["type"])

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.expectation.get("kwargs") or {})

    @property
    def column(self) -> str | None:
        return self.kwargs.get("column")

    def update(self, batch_rows: int, values: pa.Array | None, ids: pa.Array | None = None) -> None:
        """Add one batch: ``values`` of the check's column, ``ids`` the batch's ``sample_id`` (for
        ``example_ids``) when the table has one."""
        self.rows += batch_rows
        if values is None or self.error is not None:
            return
        if pa.types.is_floating(values.type):  # NaN is missing, as in Great Expectations on pandas
            values = pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)
        try:
            self._update(values, ids)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError, ValueError) as exc:
            # GX marks such an expectation failed and judges the others: so do we, naming what to fix
            self.error = (f"{self.kind} on column {self.column!r} ({values.type}): {exc}; "
                          f"fix the suite's kwargs for this column's type")
            self.hashes, self.examples, self.example_ids = [], [], []

    def _update(self, values: pa.Array, ids: pa.Array | None) -> None:
        valid = pc.drop_null(values)
        kind, kwargs = self.kind, self.kwargs
        ids_of_valid = None if ids is None or not len(valid) else (lambda: pc.filter(ids, pc.is_valid(values)))
        if kind == "expect_column_values_to_not_be_null":
            self.unexpected += len(values) - len(valid)
            if ids is not None and len(values) > len(valid):
                self._example_ids(ids, pc.is_null(values))
        elif kind == "expect_column_values_to_be_between":
            outside = _outside(valid, kwargs)
            self._count(valid, outside, ids_of_valid)
        elif kind == "expect_column_values_to_be_in_set":
            allowed = pa.array(kwargs.get("value_set") or [], valid.type if len(kwargs.get("value_set") or []) else None)
            self._count(valid, pc.invert(pc.is_in(valid, value_set=allowed.cast(valid.type))), ids_of_valid)
        elif kind == "expect_column_mean_to_be_between":
            self.total += float(pc.sum(pc.cast(valid, pa.float64())).as_py() or 0.0)
        elif kind in ("expect_column_values_to_be_unique", "expect_column_proportion_of_unique_values_to_be_between"):
            self.hashes.append(value_hashes(valid))
            if sum(len(h) for h in self.hashes) > HELD_HASHES:
                self._spill_hashes()
        self.nonnull += len(valid)

    def _spill_hashes(self) -> None:
        """The held hashes counted per hash and added to the spilled sorted runs (one run each time)."""
        if not self.hashes:
            return
        values, counts = np.unique(np.concatenate(self.hashes), return_counts=True)
        self.hashes = []
        if self.spilled is None:
            self.spilled = SortedRuns(_HASH_COUNTS, "hash", counts="count", run_rows=HELD_HASHES)
        self.spilled.add(pa.table([pa.array(values, pa.uint64()), pa.array(counts, pa.int64())],
                                  schema=_HASH_COUNTS))

    def take_hashes(self) -> np.ndarray:
        """Every hash of the check, one per row (held and spilled), removed from the check: an engine task's file."""
        parts = list(self.hashes)
        self.hashes = []
        if self.spilled is not None:
            for block in self.spilled.merged():
                parts.append(np.repeat(block.column("hash").to_numpy(), block.column("count").to_numpy()))
            self.spilled.close()
            self.spilled = None
        return np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    def merge(self, later: Check) -> None:
        """Add the aggregates of a later part of the table (an engine task's file): counts and sums add, examples
        keep scan order, hash lists join; the result is the one a single pass over both parts gives."""
        self.rows += later.rows
        self.error = self.error or later.error
        self.nonnull += later.nonnull
        self.unexpected += later.unexpected
        self.total += later.total
        self.examples.extend(later.examples[:max(0, EXAMPLES - len(self.examples))])
        self.example_ids.extend(later.example_ids[:max(0, EXAMPLES - len(self.example_ids))])
        self.unexpected_without_id += later.unexpected_without_id
        self.hashes.extend(later.hashes)
        if later.spilled is not None:
            self._spill_hashes()
            if self.spilled is None:
                self.spilled = SortedRuns(_HASH_COUNTS, "hash", counts="count", run_rows=HELD_HASHES)
            for block in later.spilled.merged():
                self.spilled.add(block)
            later.spilled.close()
            later.spilled = None
        elif sum(len(h) for h in self.hashes) > HELD_HASHES:
            self._spill_hashes()
        if later.hash_counts is not None:
            self.add_hash_counts(later.hash_counts)

    def add_hash_counts(self, counts: tuple[int, int, int]) -> None:
        """Counts of one hash partition (each hash lives in exactly one, so they add)."""
        mine = self.hash_counts or (0, 0, 0)
        self.hash_counts = (mine[0] + counts[0], mine[1] + counts[1], mine[2] + counts[2])

    def _count(self, valid: pa.Array, unexpected: pa.Array, ids: Callable[[], pa.Array] | None) -> None:
        """``ids``: the sample ids of the ``valid`` rows, filtered only when a row is unexpected (rarely)."""
        count = int(pc.sum(unexpected).as_py() or 0)
        self.unexpected += count
        if count and len(self.examples) < EXAMPLES:
            self.examples.extend(pc.filter(valid, unexpected).slice(0, EXAMPLES - len(self.examples)).to_pylist())
        if count and ids is not None:
            self._example_ids(ids(), unexpected)

    def _example_ids(self, ids: pa.Array, unexpected: pa.Array) -> None:
        if ids.null_count:  # a row without a sample_id is counted: no id to name, and never the string 'None'
            self.unexpected_without_id += int(pc.sum(pc.and_(unexpected, pc.is_null(ids))).as_py() or 0)
        if len(self.example_ids) < EXAMPLES:
            picked = pc.drop_null(pc.filter(ids, unexpected)).slice(0, EXAMPLES - len(self.example_ids))
            self.example_ids.extend(str(i) for i in picked.to_pylist())

    def result(self) -> tuple[bool, dict[str, Any]]:
        """(success, GX-shaped result dict) from the aggregates."""
        kind, kwargs = self.kind, self.kwargs
        if kind == "expect_table_row_count_to_be_between":
            return _within(self.rows, kwargs), {"observed_value": self.rows}
        if kind == "expect_column_mean_to_be_between":
            if not self.nonnull:
                return False, {"observed_value": None}
            mean = self.total / self.nonnull
            return _within(mean, kwargs), {"observed_value": mean}
        if kind == "expect_column_proportion_of_unique_values_to_be_between":
            distinct, hashed, _ = self._hash_counts()
            proportion = distinct / hashed if hashed else 0.0
            return _within(proportion, kwargs), {"observed_value": proportion}
        if kind == "expect_column_values_to_be_unique":
            self.unexpected = self._hash_counts()[2]
        base = self.rows if kind == "expect_column_values_to_not_be_null" else self.nonnull
        percent = 100.0 * self.unexpected / base if base else 0.0
        mostly = kwargs.get("mostly")
        success = self.unexpected == 0 if mostly is None else (not base or 1 - self.unexpected / base >= mostly)
        result: dict[str, Any] = {"element_count": self.rows, "unexpected_count": self.unexpected,
                                  "unexpected_percent": percent}
        if kind != "expect_column_values_to_not_be_null":
            result["partial_unexpected_list"] = self.examples[:EXAMPLES]
        return success, result


    def _hash_counts(self) -> tuple[int, int, int]:
        """(distinct, hashed, repeated) over the held, spilled and engine-counted hashes."""
        if self.spilled is not None:  # the spilled runs merged into counts, once (each hash is in one merged block)
            self._spill_hashes()
            spilled, self.spilled = self.spilled, None
            distinct = hashed = repeated = 0
            for block in spilled.merged():
                counts = block.column("count").to_numpy()
                distinct, hashed = distinct + len(counts), hashed + int(counts.sum())
                repeated += int(counts[counts > 1].sum())
            spilled.close()
            self.add_hash_counts((distinct, hashed, repeated))
        distinct, hashed, repeated = hash_counts(self.hashes)
        if self.hash_counts is not None:
            distinct, hashed, repeated = (distinct + self.hash_counts[0], hashed + self.hash_counts[1],
                                          repeated + self.hash_counts[2])
        return distinct, hashed, repeated


def hash_counts(hashes: list[np.ndarray]) -> tuple[int, int, int]:
    """(distinct hashes, hashes, hashes whose value repeats) of a hash list."""
    if not hashes:
        return 0, 0, 0
    _, counts = np.unique(np.concatenate(hashes), return_counts=True)
    return len(counts), int(counts.sum()), int(counts[counts > 1].sum())


def _within(value: float, kwargs: dict[str, Any]) -> bool:
    if isinstance(value, float) and math.isnan(value):  # NaN is within no range (it compares false with both bounds)
        return False
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if low is not None and (value <= low if kwargs.get("strict_min") else value < low):
        return False
    return not (high is not None and (value >= high if kwargs.get("strict_max") else value > high))


def _outside(valid: pa.Array, kwargs: dict[str, Any]) -> pa.Array:
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    outside = pa.array(np.zeros(len(valid), dtype=bool))
    if low is not None:
        outside = pc.or_(outside, pc.less_equal(valid, low) if kwargs.get("strict_min") else pc.less(valid, low))
    if high is not None:
        outside = pc.or_(outside, pc.greater_equal(valid, high) if kwargs.get("strict_max") else pc.greater(valid, high))
    return outside


def evaluate(checks: Iterable[Check], batches: Iterable[pa.Table]) -> None:
    """Feed every batch (validation columns) to every check."""
    checks = list(checks)
    for batch in batches:
        ids = batch.column(ID_COLUMN).combine_chunks() if ID_COLUMN in batch.column_names else None
        for check in checks:
            column = check.column
            values = None
            if column is not None and column in batch.column_names:
                values = batch.column(column).combine_chunks()
            named = check.kind in ID_TYPES and column != ID_COLUMN  # a check on the ids has none to name
            check.update(batch.num_rows, values, ids if named else None)
