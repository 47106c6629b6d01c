"""QA run by an engine: the same verdicts as the local pass, computed where the data is.

- Ray: one plain Ray task per data file of the version computes that file's partial aggregates
  (``datahub.qa.validate.aggregate_batches``: counts, sums, examples, its rows of the every-k-th-row sample, placed
  by the file's first row); the driver merges them in file order and judges as the local pass does. The value hashes
  of the uniqueness checks are split by value into P parts that stay in Ray's object store; P reduce tasks count
  distinct and repeated values per part, and only those counts reach the driver.
- Spark: one Spark task per file turns its rows into the validation columns (``validation_batch``: the same
  ``text_length``, ``text_id`` and ``quality_<signal>``), and Great Expectations validates that Spark DataFrame with
  its Spark execution engine (every expectation type: GX computes its metrics as Spark jobs, nothing is collected).
  An expectation GX raises on with Spark (no Spark implementation) falls back to the local streaming pass
  (aggregate or bounded sample); its entry's ``spark_fallback`` says why. A row check with unexpected rows
  (``ID_TYPES``; a ``mostly`` check that passes too, as in the local pass) names the ``sample_id`` of its first
  ``EXAMPLES`` ones as the local pass does, in its scan order: each task numbers its rows (``FILE``: the file's index
  in the version's file list; ``ROW``: the row in the file), and one Spark aggregate for all such checks keeps, per
  check, the ``EXAMPLES`` smallest (``FILE``, ``ROW``) with an id (``min_by`` with a limit: each task keeps at most
  ``EXAMPLES`` a check) and counts the unexpected rows without an id. The DataFrame is cached once, with the
  position columns: GX's metric jobs and that aggregate read the cache, not the files, and it is unpersisted when
  the suites are done (GX's own cache of a run was never released).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from datahub.config.suites import Suite
from datahub.engines.base import Engine
from datahub.lake.lake import Lake
from datahub.qa.aggregates import EXAMPLES, ID_COLUMN, ID_TYPES, hash_counts
from datahub.qa.posttraining import mistyped_sources
from datahub.qa.validate import (
    PassPlan,
    Partial,
    aggregate_batches,
    finish_pass,
    merge_partials,
    plan_pass,
    read_batches,
    run_expectations,
    run_suites_streaming,
    unrunnable,
    validation_batch,
    validation_columns,
)

Outcome = list[tuple[bool, list[dict[str, Any]]]]
# A Spark row's place in the local pass's scan order, sorted on as (FILE, ROW): the file's index in the version's
# file list, the row in the file (two columns: one packed int64 overflowed at file index 2**23)
FILE = "__datahub_qa_file"
ROW = "__datahub_qa_row"


@dataclass(frozen=True)
class _FileAggregates:
    """A Ray task: one data file's partial aggregates (picklable)."""

    lake: Lake
    table: str
    version: int
    plan: PassPlan

    def __call__(self, task: tuple[str, int]) -> Partial:
        path, start = task
        batches = read_batches(self.lake.dataset(self.table, self.version), self.plan.read,
                               batch_rows=self.plan.batch_rows, files=[path])
        return aggregate_batches(self.plan, batches, start=start)


@dataclass(frozen=True)
class _FileValidationColumns:
    """A Spark task's read: one data file's validation columns, batch by batch, and each row's ``FILE`` and ``ROW``
    (picklable)."""

    lake: Lake
    table: str
    version: int
    read: tuple[str, ...]
    wanted: frozenset[str]
    batch_rows: int

    def __call__(self, task: tuple[int, str]) -> Iterator[pa.Table]:
        index, path = task
        row = 0
        for batch in read_batches(self.lake.dataset(self.table, self.version), self.read,
                                  batch_rows=self.batch_rows, files=[path]):
            columns = validation_batch(batch, set(self.wanted))
            rows = np.arange(row, row + columns.num_rows, dtype=np.int64)
            row += columns.num_rows
            columns = columns.append_column(FILE, pa.array(np.full(columns.num_rows, index, dtype=np.int64)))
            yield columns.append_column(ROW, pa.array(rows))


@dataclass(frozen=True)
class _FileAggregatesSplit:
    """A Ray map task: one file's partial aggregates, its value hashes split into ``partitions`` parts by value
    (the parts go to the reduce tasks, not to the driver)."""

    aggregates: _FileAggregates
    partitions: int

    def __call__(self, task: tuple[str, int]) -> tuple[Partial, list[dict[int, np.ndarray]]]:
        partial = self.aggregates(task)
        parts: list[dict[int, np.ndarray]] = [{} for _ in range(self.partitions)]
        for index, check in enumerate(partial.checks):
            if check.hashes or check.spilled is not None:
                hashes = check.take_hashes()
                bucket = hashes % np.uint64(self.partitions)
                for p in range(self.partitions):
                    parts[p][index] = hashes[bucket == p]
        return partial, parts


def _count_partition(parts: list[dict[int, np.ndarray]]) -> dict[int, tuple[int, int, int]]:
    """A Ray reduce task: (distinct, hashed, repeated) per check over one hash partition of every file."""
    by_check: dict[int, list[np.ndarray]] = {}
    for part in parts:
        for index, hashes in part.items():
            by_check.setdefault(index, []).append(hashes)
    return {index: hash_counts(hashes) for index, hashes in by_check.items()}


def run_suites_on_ray(engine: Engine, lake: Lake, suites: list[Suite], *, table: str, version: int,
                      batch_rows: int | None = None, workers: int | None = None) -> Outcome:
    """The aggregate pass as Ray tasks, one per data file; partials merged on the driver in file order."""
    dataset = lake.dataset(table, version)
    fragments = list(dataset.get_fragments())
    counts = [fragment.count_rows() for fragment in fragments]  # Parquet footers: where each file's rows begin
    options = {"batch_rows": batch_rows} if batch_rows else {}
    plan = plan_pass(pa.schema(dataset.schema), suites, total_rows=sum(counts), **options)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    map_reduce = importlib.import_module("datahub.engines.ray.tasks").map_reduce
    partitions = max(1, workers or engine.parallelism)  # type: ignore[attr-defined]
    partials, counted = map_reduce(engine, [(f.path, s) for f, s in zip(fragments, starts)],
                                   _FileAggregatesSplit(_FileAggregates(lake, table, version, plan), partitions),
                                   _count_partition, partitions=partitions, workers=workers)
    merged = merge_partials(plan, partials)
    for partition in counted:
        for index, counts in partition.items():
            merged.checks[index].add_hash_counts(counts)
    return finish_pass(plan, merged)


def run_suites_on_spark(engine: Engine, lake: Lake, suites: list[Suite], *, table: str, version: int,
                        batch_rows: int = 4096) -> Outcome:
    """Great Expectations' Spark execution engine on a DataFrame of the version's validation columns."""
    dataset = lake.dataset(table, version)
    schema = pa.schema(dataset.schema)
    sources = validation_columns(schema)
    # expectations on a column the table cannot give fail here, as in the local pass (same error, same index in
    # the suite file); Great Expectations runs the others
    failed = [unrunnable(suite, set(sources), mistyped_sources(schema)) for suite in suites]
    runnable = [Suite(s.name, s.version, [e for i, e in enumerate(s.expectations) if i not in bad], s.path, s.meta)
                for s, bad in zip(suites, failed)]
    named = {(e.get("kwargs") or {}).get("column") for suite in suites for e in suite.expectations}
    if ID_COLUMN in sources and any(e.get("type") in ID_TYPES for suite in runnable for e in suite.expectations):
        named.add(ID_COLUMN)  # to name the unexpected rows
    wanted = frozenset(c for c in sources if c in named) or frozenset(sorted(sources)[:1])
    read = tuple(sorted({s for c in wanted for s in sources[c]})) or (schema.names[0],)
    columns = validation_batch(schema.empty_table().select(list(read)), set(wanted)).schema
    columns = columns.append(pa.field(FILE, pa.int64())).append(pa.field(ROW, pa.int64()))
    files = list(enumerate(fragment.path for fragment in dataset.get_fragments()))  # the local pass's file order
    read_dataframe = importlib.import_module("datahub.engines.spark.tasks").read_dataframe
    jobs_ended_on_exit = importlib.import_module("datahub.engines.spark.jobs").jobs_ended_on_exit
    # GX catches a failed Spark job's error (the expectation gets an error entry, computed again locally): the
    # job's other tasks must end before the fallback reads the same files, and before the caller goes on
    with jobs_ended_on_exit(engine.session):  # type: ignore[attr-defined]
        task = _FileValidationColumns(lake, table, version, read, wanted, batch_rows)
        frame = read_dataframe(engine, files, task, columns)
        # one cache for GX and the ids: Spark serves GX's projection without the position columns from it (GX's
        # own persist would cache another copy, and GX never unpersists it)
        frame.persist()
        try:
            outcomes = [run_expectations(frame.drop(FILE, ROW), _without_null_in_sets(suite), spark=True,
                                         persist=False) for suite in runnable]
            for suite, (_, entries) in zip(runnable, outcomes):
                _restore_value_sets(suite, entries)
            if ID_COLUMN in wanted:
                _name_unexpected_rows(frame, [entry for _, entries in outcomes for entry in entries])
        finally:
            frame.unpersist(blocking=True)
    out = []
    for suite, outcome, bad in zip(runnable, outcomes, failed):
        _, entries = _fallback(lake, suite, outcome, table=table, version=version)
        entries = [*entries, *bad.values()]
        out.append((all(e["success"] is not False for e in entries), entries))
    return out


def _null_in_set(expectation: dict[str, Any]) -> bool:
    return (expectation.get("type") == "expect_column_values_to_be_in_set"
            and None in ((expectation.get("kwargs") or {}).get("value_set") or []))


def _without_null_in_sets(suite: Suite) -> Suite:
    """``suite`` with None left out of every in_set value_set. The check tests non-null values, which a null in the
    set never matches (the local pass and GX on pandas: 'de' is unexpected in ["en", None]); GX on Spark tests
    ``col IN ('en', NULL)``, which is null, not false, for 'de', so it counted no unexpected row and passed."""
    return Suite(suite.name, suite.version, [
        {**e, "kwargs": {**e["kwargs"], "value_set": [v for v in e["kwargs"]["value_set"] if v is not None]}}
        if _null_in_set(e) else e for e in suite.expectations], suite.path, suite.meta)


def _restore_value_sets(suite: Suite, entries: list[dict[str, Any]]) -> None:
    """The suite's own value_set (its None included) back on the entries ``_without_null_in_sets`` changed."""
    for expectation in filter(_null_in_set, suite.expectations):
        kwargs = expectation["kwargs"]
        stripped = [v for v in kwargs["value_set"] if v is not None]
        for entry in entries:
            if (entry["expectation"] == expectation["type"] and entry["kwargs"].get("column") == kwargs.get("column")
                    and entry["kwargs"].get("value_set") == stripped and not entry.get("_restored")):
                entry["kwargs"]["value_set"] = list(kwargs["value_set"])
                entry["_restored"] = True
                break
    for entry in entries:
        entry.pop("_restored", None)


def _unexpected_rows(entry: dict[str, Any], column: str) -> str | None:
    """The Spark SQL predicate of ``entry``'s unexpected rows on ``column`` (its name as Spark carries it), as the
    local pass counts them (``Check._update``), or None when it names no ids: another type, an error (the
    fallback's local pass names them), none unexpected, or a check on the ids themselves."""
    kwargs = entry["kwargs"]
    unexpected = (entry.get("observed") or {}).get("unexpected_count")
    if entry["expectation"] not in ID_TYPES or entry.get("error") or not unexpected \
            or kwargs.get("column") in (None, ID_COLUMN):
        return None
    if entry["expectation"] == "expect_column_values_to_not_be_null":
        return f"{column} IS NULL"
    if entry["expectation"] == "expect_column_values_to_be_in_set":
        # the local pass tests non-null values only, which a null in the set never matches; in SQL it would make
        # ``NOT col IN (..., NULL)`` null (no row) for every value outside the set
        allowed = [_literal(v) for v in kwargs.get("value_set") or [] if v is not None]
        return f"{column} IS NOT NULL AND NOT {column} IN ({', '.join(allowed)})" if allowed else f"{column} IS NOT NULL"
    outside = []
    if kwargs.get("min_value") is not None:
        outside.append(f"{column} {'<=' if kwargs.get('strict_min') else '<'} {_literal(kwargs['min_value'])}")
    if kwargs.get("max_value") is not None:
        outside.append(f"{column} {'>=' if kwargs.get('strict_max') else '>'} {_literal(kwargs['max_value'])}")
    return f"{column} IS NOT NULL AND ({' OR '.join(outside)})" if outside else None


def _literal(value: Any) -> str:
    """``value`` as a Spark SQL literal (suite JSON holds numbers, strings, booleans and null)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value!r}D" if value == value and abs(value) != float("inf") else f"CAST('{value}' AS DOUBLE)"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _first_unexpected(predicate: str, ids: str, index: int) -> list[str]:
    """Spark SQL aggregates of one check: its first ``EXAMPLES`` ids where ``predicate`` holds, by (``FILE``,
    ``ROW``) (``min_by`` with a limit keeps at most ``EXAMPLES`` a task), and its count of such rows without an id."""
    return [f"min_by({ids}, struct({FILE}, {ROW}), {EXAMPLES}) FILTER (WHERE ({predicate}) AND {ids} IS NOT NULL)"
            f" AS ids{index}",
            f"count_if(({predicate}) AND {ids} IS NULL) AS without{index}"]


def _name_unexpected_rows(frame: Any, entries: list[dict[str, Any]]) -> None:
    """Add ``unexpected_sample_ids`` (the first ``EXAMPLES`` by (``FILE``, ``ROW``): the local pass's scan order)
    and ``unexpected_rows_without_sample_id`` to the entries of row checks with unexpected rows, as the local pass
    does: one Spark aggregate for all of them. An entry Spark cannot name (its predicate does not analyse, or its
    job failed) gets ``unexpected_sample_ids_error`` instead; GX's verdicts stay as they are."""
    spark_name = importlib.import_module("datahub.engines.spark.arrow").spark_name
    ids = _quoted(spark_name(ID_COLUMN))
    named: list[tuple[dict[str, Any], list[str]]] = []
    for entry in entries:
        predicate = _unexpected_rows(entry, _quoted(spark_name(entry["kwargs"].get("column") or "")))
        if not predicate:
            continue
        aggregates = _first_unexpected(predicate, ids, len(named))
        try:
            frame.selectExpr(*aggregates)  # analysed here, no job: a predicate Spark cannot type fails alone
        except Exception as exc:  # noqa: BLE001  (pyspark's errors; datahub.qa does not import pyspark)
            _not_named(entry, exc)
            continue
        named.append((entry, aggregates))
    if not named:
        return
    try:
        rows = [frame.selectExpr(*(a for _, aggregates in named for a in aggregates)).collect()[0]]
    except Exception:  # noqa: BLE001  a failed job: each entry on its own, so one failing check names no others
        rows = []
    for index, (entry, aggregates) in enumerate(named):
        try:
            row = rows[0] if rows else frame.selectExpr(*aggregates).collect()[0]
        except Exception as exc:  # noqa: BLE001
            _not_named(entry, exc)
            continue
        if row[f"ids{index}"]:
            entry["unexpected_sample_ids"] = [str(i) for i in row[f"ids{index}"]]
        if row[f"without{index}"]:
            entry["unexpected_rows_without_sample_id"] = int(row[f"without{index}"])


def _not_named(entry: dict[str, Any], exc: Exception) -> None:
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    entry["unexpected_sample_ids_error"] = (f"Spark could not name the unexpected rows' sample_id ({reason}); "
                                            f"the local pass names them: datahub qa without --engine spark")


def _fallback(lake: Lake, suite: Suite, outcome: tuple[bool, list[dict[str, Any]]], *, table: str,
              version: int) -> tuple[bool, list[dict[str, Any]]]:
    """Expectations GX could not run on Spark (it raised: a type without a Spark implementation) are computed by
    the local streaming pass (aggregate or bounded sample) instead; each such entry says so in ``spark_fallback``."""
    _, entries = outcome
    errored = [i for i, e in enumerate(entries) if e.get("error")]
    if not errored:
        return outcome
    unused = list(suite.expectations)
    picked: dict[int, dict[str, Any]] = {}
    for i in errored:
        entry = entries[i]
        for expectation in unused:
            if (expectation.get("type") == entry["expectation"]
                    and (expectation.get("kwargs") or {}).get("column") == entry["kwargs"].get("column")):
                picked[i] = expectation
                unused.remove(expectation)
                break
    if not picked:
        return outcome
    dataset = lake.dataset(table, version)
    sub = Suite(suite.name, suite.version, list(picked.values()), suite.path)
    _, redone = run_suites_streaming(dataset, [sub], total_rows=dataset.count_rows())[0]
    merged = list(entries)
    for i in picked:
        entry = next(e for e in redone if e["expectation"] == entries[i]["expectation"]
                     and e["kwargs"].get("column") == entries[i]["kwargs"].get("column"))
        redone.remove(entry)
        merged[i] = {**entry, "spark_fallback": f"GX could not run it on Spark ({entries[i]['error']}); "
                                                f"computed by the local streaming pass"}
    return all(e["success"] is not False for e in merged), merged
