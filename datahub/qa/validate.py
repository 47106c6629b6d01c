"""Run suites on one table version: one streaming pass of aggregates (``datahub.qa.aggregates``) for the
expectation types it covers, Great Expectations 1.x on a bounded sample for the others.

Derived validation columns from ``text`` (suites name them like table columns): ``text_length`` (characters, every
row), ``document_length`` (``text_length`` on document rows: kind ``text`` or ``image_text``, a null kind, or a table
without ``kind``; null on chat, preference and trajectory rows, whose ``text`` renders a whole conversation or up to
1,024 steps: ``datahub.qa.posttraining.document_lengths``) and ``text_id`` (equal texts share an id). Column-map
expectations judge non-null values only, so samples.v1's 1,000,000-character bound on ``document_length`` leaves
post-training rows alone while its ``text_length >= 1`` still judges every row.

great_expectations and pandas are imported here only, when a suite needs them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.close_names import did_you_mean
from datahub.config.suites import Suite
from datahub.lake.scan import scan_batches
from datahub.progress import Progress, counted
from datahub.qa.aggregates import EXACT_TYPES, ID_COLUMN, ID_TYPES, SAMPLE_ROWS, Check, evaluate, value_hashes
from datahub.qa.posttraining import (
    DERIVED,
    KIND_COLUMN,
    compute_derived,
    derived_columns,
    document_lengths,
    judged_by_kind,
    mistyped_sources,
)

BATCH_ROWS = 4096
# Decoded bytes of the read columns one batch may hold, about: fewer rows a batch when rows are wide. 4,096 rows of
# 5 KB texts (20 MB) keep 4,096 rows; trajectory segments of 1,024 steps (~250 KB of steps and as much text a row)
# would make a 4,096-row batch ~2 GB, and a 1,000-row file's one batch peaked at 1.4 GB of RSS (bench_traj).
# Counted on the decoded reads (their Arrow buffers' ``get_total_buffer_size()``: ``bounded_batches``).
# ``chosen_equals_rejected`` copies the equal-length rows of both replies once a batch: up to ~2x those columns.
BATCH_BYTES = 32 * 2**20
# Rows one Parquet read decodes: a batch ends before the read that would take it past BATCH_BYTES, so only a read
# wider than BATCH_BYTES alone exceeds it (64 rows of 1,024 steps and their text: ~30 MB). Not sized from the
# footers: their bytes a row (averaged over a row group) understate a run of wide rows among short texts 6x and
# dictionary-encoded pages ~1000x (reviewer-qa's mixed.py, bytes.py); pyarrow reads a row group at one batch size,
# so reads cannot grow and shrink within one either. Reads decode in this thread (``use_threads=False``): Arrow's
# thread pool cost more than a 64-row decode. samples.v1 over 300k short texts, alternated in 3 runs at load 7-8:
# CPU median 0.42-0.44 s (0.56-0.63 s threaded, 0.36-0.38 s with 4,096-row reads); wall time followed the loaded
# scheduler (faster in 1 run of 3), so no wall win is claimed. The floor of any read size is one Parquet page, which
# writers close once a 1,024-value write batch passes 1 MB (tests/qa/test_read_memory.py).
READ_ROWS = 64
DOCUMENT_LENGTH = "document_length"  # text_length of document rows (module docstring)
TEXT_DERIVED = ("text_length", DOCUMENT_LENGTH, "text_id")  # validation columns derived from ``text``


def bounded_batches(reads: Iterable[pa.RecordBatch], *, max_rows: int) -> Iterator[pa.Table]:
    """Consecutive ``reads`` joined (no copy: one chunk each) into batches of at most ``max_rows`` rows and at most
    ``BATCH_BYTES`` of decoded columns (a read wider than that alone is a batch of its own)."""
    pending: list[pa.RecordBatch] = []
    rows = size = 0
    for read in reads:
        if not read.num_rows:
            continue
        # the read's buffers, whole: at least its ``nbytes`` (equal for a fresh decode), and ~20x cheaper to sum
        # (``nbytes`` walks each string column's offsets: 10-25 us a 64-row read, a quarter of the read itself)
        read_bytes = read.get_total_buffer_size()
        if pending and (rows + read.num_rows > max_rows or size + read_bytes > BATCH_BYTES):
            yield pa.Table.from_batches(pending)
            pending, rows, size = [], 0, 0
        pending.append(read)
        rows += read.num_rows
        size += read_bytes
        if size >= BATCH_BYTES or rows >= max_rows:
            yield pa.Table.from_batches(pending)
            pending, rows, size = [], 0, 0
    if pending:
        yield pa.Table.from_batches(pending)


def read_batches(dataset: Any, columns: Iterable[str], *, batch_rows: int, files: list[str] | None = None
                 ) -> Iterator[pa.Table]:
    """``columns`` of ``dataset`` (``files`` only, when given) in batches of at most ``batch_rows`` rows and about
    ``BATCH_BYTES`` decoded: ``scan_batches`` reads of ``READ_ROWS`` rows (no Arrow threads) joined by
    ``bounded_batches``. What the local pass, each Ray task and each Spark task validate. A batch never spans two
    files: the local pass then sums exactly as the Ray tasks (one per file) do, floating-point order included."""
    import pyarrow.dataset as ds

    only = set(files) if files is not None else None
    for fragment in dataset.get_fragments():
        if only is not None and fragment.path not in only:
            continue
        one = ds.FileSystemDataset([fragment], dataset.schema, dataset.format, dataset.filesystem)
        reads = scan_batches(one, columns=list(columns), batch_rows=min(READ_ROWS, batch_rows), use_threads=False)
        yield from bounded_batches(reads, max_rows=batch_rows)


def validation_columns(schema: pa.Schema) -> dict[str, tuple[str, ...]]:
    """Columns suites can name -> the table columns they come from (``text_length`` and ``text_id`` from
    ``text``, ``document_length`` from ``text`` and ``kind`` when the table has it, ``quality_<signal>`` from the
    ``quality`` struct, the post-training columns of ``datahub.qa.posttraining`` from ``messages``,
    ``chosen``/``rejected`` or ``steps`` and ``kind``, flat columns from themselves)."""
    columns: dict[str, tuple[str, ...]] = {}
    for column in schema:
        if column.name == "quality" and pa.types.is_struct(column.type):
            for child in column.type:
                columns[f"quality_{child.name}"] = ("quality",)
        elif not pa.types.is_nested(column.type):
            columns[column.name] = (column.name,)
    kind = (KIND_COLUMN,) if judged_by_kind(schema) else ()  # a row of the kind is judged when its list is null
    if "text" in schema.names:
        columns["text_length"] = columns["text_id"] = ("text",)
        columns[DOCUMENT_LENGTH] = ("text", *kind)  # which rows are documents
    for derived in derived_columns(schema):
        columns.setdefault(derived.name, derived.sources + kind)  # a stored column of that name wins
    return columns


def _flat_columns(table: pa.Table, wanted: set[str] | None) -> dict[str, Any]:
    """The table's flat columns and one ``quality_<signal>`` column per quality struct field; only the
    ``wanted`` names when given (derived text columns are added by the callers)."""
    columns: dict[str, Any] = {}
    for name in table.column_names:
        column = table.column(name)
        if name == "quality" and pa.types.is_struct(column.type):
            struct = column.combine_chunks()
            for i, child in enumerate(struct.type):
                if wanted is None or f"quality_{child.name}" in wanted:
                    columns[f"quality_{child.name}"] = struct.field(i)
        elif (wanted is None or name in wanted) and not pa.types.is_nested(column.type):
            columns[name] = column
    return columns


def validation_batch(batch: pa.RecordBatch | pa.Table, wanted: set[str]) -> pa.Table:
    """The ``wanted`` validation columns of one batch. ``text_id`` here is the text's 64-bit hash (equal
    texts share it), so it streams; ``validation_frame``'s dictionary ids say the same for one frame."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    columns = _flat_columns(table, wanted)
    for name, column in columns.items():  # NaN is missing, as in GX on pandas (Spark's GX would count it)
        if pa.types.is_floating(column.type):
            columns[name] = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
    if "text" in table.column_names:
        text = table.column("text").combine_chunks()
        if "text_length" in wanted or DOCUMENT_LENGTH in wanted:
            lengths = pc.utf8_length(text)
            if "text_length" in wanted:
                columns["text_length"] = lengths
            if DOCUMENT_LENGTH in wanted:
                columns[DOCUMENT_LENGTH] = document_lengths(table, lengths)
        if "text_id" in wanted:
            hashes = np.zeros(len(text), dtype=np.uint64)
            valid = np.asarray(pc.is_valid(text))
            hashes[valid] = value_hashes(pc.drop_null(text))
            columns["text_id"] = pa.array(hashes.view(np.int64), mask=~valid)
    for name, values in compute_derived(table, wanted - set(columns)).items():
        columns[name] = values
    return pa.table(columns) if columns else pa.table({"_rows": pa.nulls(table.num_rows, pa.int8())})


@dataclass(frozen=True)
class SuiteRun:
    """How each expectation of a suite is evaluated."""

    suite: Suite
    skipped: list[dict[str, Any]]
    checks: list[Check]  # exact, from streamed aggregates
    sampled: list[dict[str, Any]]  # Great Expectations on the bounded sample
    order: list[tuple[str, int]]  # ("check" | "sampled" | "missing", index) in suite order
    missing: list[dict[str, Any]] = field(default_factory=list)  # failed entries: a column the table cannot give


def plan_suite(suite: Suite, available: set[str], mistyped: dict[str, str] | None = None) -> SuiteRun:
    """How each expectation of ``suite`` runs on a table whose validation columns are ``available``; ``mistyped``
    (``datahub.qa.posttraining.mistyped_sources``): an expectation on a column derived from one of those fails
    with what is wrong, even when optional (the table has the column, just not of a type it can be derived from)."""
    skipped: list[dict[str, Any]] = []
    checks: list[Check] = []
    sampled: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    order: list[tuple[str, int]] = []
    failed = unrunnable(suite, available, mistyped)
    for index, expectation in enumerate(suite.expectations):
        column = (expectation.get("kwargs") or {}).get("column")
        if index in failed:
            order.append(("missing", len(missing)))
            missing.append(failed[index])
            continue
        if column is not None and column not in available:  # optional
            skipped.append(_entry(expectation, success=None, observed=None, skipped=f"column {column!r} not in table"))
            continue
        clean = {k: v for k, v in expectation.items() if k in ("type", "kwargs", "meta")}
        if clean["type"] in EXACT_TYPES:
            order.append(("check", len(checks)))
            checks.append(Check(clean))
        else:
            order.append(("sampled", len(sampled)))
            sampled.append(clean)
    return SuiteRun(suite, skipped, checks, sampled, order, missing)


def unrunnable(suite: Suite, available: set[str], mistyped: dict[str, str] | None = None) -> dict[int, dict[str, Any]]:
    """Index in ``suite`` -> failed entry of each expectation on a column the table cannot give (not optional, or
    derived from a ``mistyped`` column), its error naming the suite file and that index: one error path for the
    local pass, Ray and Spark (which leaves them out of what Great Expectations runs)."""
    failed = {}
    for index, expectation in enumerate(suite.expectations):
        column = (expectation.get("kwargs") or {}).get("column")
        if column is None or column in available:
            continue
        if not (expectation.get("meta") or {}).get("optional") or _wrong_sources(column, mistyped or {}):
            failed[index] = _entry(expectation, success=False, observed=None,
                                   error=missing_column(suite, index, column, available, mistyped))
    return failed


def _wrong_sources(column: str, mistyped: dict[str, str]) -> list[str]:
    derived = DERIVED.get(column)
    return [mistyped[source] for source in derived.sources if source in mistyped] if derived is not None else []


def missing_column(suite: Suite, index: int, column: str, available: set[str],
                   mistyped: dict[str, str] | None = None) -> str:
    """Why expectation ``index`` of ``suite`` cannot run on a table whose validation columns are ``available``
    (and whose ``mistyped`` source columns have another type), naming the suite file, the expectation and the fix."""
    expectation = suite.expectations[index]
    where = f"{suite.path}: expectations[{index}] ({expectation.get('type')} on {column!r})"
    derived = DERIVED.get(column)
    wrong = _wrong_sources(column, mistyped or {})
    if derived is not None and wrong:
        return (f"{where}: {column!r} is derived from {', '.join(derived.sources)} ({derived.kind} samples), but this "
                f"table's {'; '.join(wrong)}: it does not hold {derived.kind} samples; run the suite on a table "
                f"datahub wrote {derived.kind} samples to, or leave it out (--suite samples.v1)")
    if column in TEXT_DERIVED:
        return (f"{where}: {column!r} is derived from the text column, and this table has none (columns here: "
                f"{', '.join(sorted(available))}); run the suite on a table with the samples schema's text column, "
                f"or name suites for this table with --suite")
    if derived is not None:
        lacking = [source for source in derived.sources if source not in available]
        return (f"{where}: {column!r} is derived from {', '.join(derived.sources)} ({derived.kind} samples) and this "
                f"table has no {', '.join(lacking)} column; add \"meta\": {{\"optional\": true}} to the expectation "
                f"to skip it on tables without {derived.kind} samples, or run the suite on a table that has them")
    known = sorted(available | set(DERIVED))
    return (f"{where}: the table has no column {column!r} and none is derived under that name"
            f"{did_you_mean(column, known)}; fix kwargs.column (columns here: {', '.join(sorted(available))}; "
            f"derived post-training columns: {', '.join(DERIVED)}) or add \"meta\": {{\"optional\": true}} to "
            f"skip it where the column is absent")


@dataclass(frozen=True)
class PassPlan:
    """What one pass over a table version reads and computes (picklable: engine tasks get it)."""

    runs: tuple[SuiteRun, ...]
    sources: dict[str, tuple[str, ...]]  # validation column -> the table columns it comes from
    wanted: frozenset[str]  # validation columns computed per batch
    read: tuple[str, ...]  # table columns read
    stride: int  # every stride-th row of the table goes to the sample
    batch_rows: int

    @property
    def sampling(self) -> bool:
        return any(run.sampled for run in self.runs)

    def fresh_checks(self) -> list[Check]:
        """Empty aggregates of every exact expectation, suites in order (one list per pass or engine task)."""
        return [Check(check.expectation) for run in self.runs for check in run.checks]


@dataclass
class Partial:
    """The aggregates of one part of the table (all of it locally, one data file in an engine task)."""

    checks: list[Check]
    sample: list[pa.Table]
    rows: int


def plan_pass(schema: pa.Schema, suites: list[Suite], *, total_rows: int, batch_rows: int = BATCH_ROWS) -> PassPlan:
    sources = validation_columns(schema)
    mistyped = mistyped_sources(schema)
    runs = tuple(plan_suite(s, set(sources), mistyped) for s in suites)
    wanted = {c for run in runs for c in [*(ch.column for ch in run.checks),
                                           *((e.get("kwargs") or {}).get("column") for e in run.sampled)] if c}
    if any(run.sampled for run in runs):  # a sampled expectation may read any column
        wanted |= set(sources)
    if ID_COLUMN in sources and any(check.kind in ID_TYPES for run in runs for check in run.checks):
        wanted.add(ID_COLUMN)  # to name the unexpected rows
    read = tuple(sorted({s for c in wanted if c in sources for s in sources[c]}) or [schema.names[0]])
    stride = max(1, math.ceil(total_rows / SAMPLE_ROWS))
    return PassPlan(runs, sources, frozenset(wanted), read, stride, batch_rows)


def aggregate_batches(plan: PassPlan, batches: Iterable[pa.RecordBatch | pa.Table], *, start: int = 0) -> Partial:
    """Stream ``batches`` (the plan's ``read`` columns) through fresh aggregates; ``start``: the table row the
    first batch begins at, so the every-k-th-row sample is the same however the table is split."""
    sample: list[pa.Table] = []
    position = start

    def validation_batches() -> Iterator[pa.Table]:
        nonlocal position
        for batch in batches:
            if not batch.num_rows:
                continue
            table = validation_batch(batch, set(plan.wanted))
            if plan.sampling:
                first = (-position) % plan.stride
                sample.append(table.take(pa.array(np.arange(first, table.num_rows, plan.stride))))
            position += table.num_rows
            yield table

    checks = plan.fresh_checks()
    evaluate(checks, validation_batches())
    return Partial(checks, sample, position - start)


def merge_partials(plan: PassPlan, partials: Iterable[Partial]) -> Partial:
    """The partials of consecutive parts of the table, in table order, as one."""
    merged = Partial(plan.fresh_checks(), [], 0)
    for part in partials:
        for mine, theirs in zip(merged.checks, part.checks):
            mine.merge(theirs)
        merged.sample.extend(part.sample)
        merged.rows += part.rows
    return merged


def run_suites_streaming(dataset: Any, suites: list[Suite], *, total_rows: int, batch_rows: int = BATCH_ROWS,
                         progress: Progress | None = None
                         ) -> list[tuple[bool, list[dict[str, Any]]]]:
    """Run ``suites`` over a ``pyarrow.dataset`` of Parquet files (``Lake.dataset``) in one pass of ``batch_rows``
    batches (``scan_batches``: no read-ahead, so a slow pass holds one batch), reading only the columns
    they name (fewer rows a batch where rows are wide: ``read_batches``); returns (success, entries) per
    suite, entries in the shape ``run_expectations`` gives.
    ``progress("rows", done, total_rows)`` is called after each batch (a long pass is never silent)."""
    plan = plan_pass(pa.schema(dataset.schema), suites, total_rows=total_rows, batch_rows=batch_rows)
    batches = counted(read_batches(dataset, plan.read, batch_rows=plan.batch_rows), progress, "rows",
                      total=total_rows, rows=lambda batch: batch.num_rows)
    return finish_pass(plan, aggregate_batches(plan, batches))


def finish_pass(plan: PassPlan, done: Partial) -> list[tuple[bool, list[dict[str, Any]]]]:
    """Verdicts from the whole table's aggregates (exact types) and Great Expectations on its sample (others)."""
    out = []
    offset = 0
    for run in plan.runs:
        checks = done.checks[offset:offset + len(run.checks)]
        offset += len(run.checks)
        sampled_entries: list[dict[str, Any]] = []
        if run.sampled:
            frame = (pa.concat_tables(done.sample) if done.sample else pa.table({})).to_pandas()
            sampled_suite = Suite(run.suite.name, run.suite.version, run.sampled, run.suite.path)
            _, sampled_entries = run_expectations(frame, sampled_suite)
            if plan.stride > 1:
                for entry in sampled_entries:
                    entry["sample"] = f"every {plan.stride}th row: {len(frame)} of {done.rows} rows"
        entries = list(run.skipped)
        for kind, index in run.order:
            if kind == "sampled":
                entries.append(sampled_entries[index])
                continue
            if kind == "missing":
                entries.append(run.missing[index])
                continue
            check = checks[index]
            if check.error is not None:
                entries.append(_entry(check.expectation, success=False, observed=None,
                                      error=f"{run.suite.name}: {check.error} (suite file {run.suite.path})"))
                continue
            success, result = check.result()
            entry = _entry(check.expectation, success=success, observed=_observed(result))
            if check.example_ids:
                entry["unexpected_sample_ids"] = list(check.example_ids)
            if check.unexpected_without_id:
                entry["unexpected_rows_without_sample_id"] = check.unexpected_without_id
            entries.append(entry)
        out.append((all(e["success"] is not False for e in entries), entries))
    return out


def validation_frame(table: pa.Table) -> Any:
    """The pandas frame suites see on one in-memory table: the table's flat columns plus derived ones.

    ``text_length`` (characters), ``document_length`` (``text_length`` of document rows, null on post-training
    ones), ``text_id`` (equal texts share an id, so the proportion of
    unique ids is 1 - exact-duplicate rate), ``quality_<signal>`` per quality struct field and the post-training
    columns of ``datahub.qa.posttraining``.
    """
    columns = _flat_columns(table, None)
    if "text" in table.column_names:
        text = table.column("text").combine_chunks()
        columns["text_length"] = pc.utf8_length(text)
        columns[DOCUMENT_LENGTH] = document_lengths(table, columns["text_length"])
        columns["text_id"] = pc.dictionary_encode(text).indices if len(text) else pa.array([], pa.int32())
    for name, values in compute_derived(table).items():
        columns.setdefault(name, values)
    return pa.table(columns).to_pandas()


def run_expectations(frame: Any, suite: Suite, *, spark: bool = False,
                     persist: bool = True) -> tuple[bool, list[dict[str, Any]]]:
    """Validate ``frame`` (pandas, or with ``spark`` a ``pyspark.sql.DataFrame`` that Great Expectations' Spark
    execution engine reads) against ``suite``; returns (success, one JSON-able dict per expectation). ``persist``:
    whether GX caches the Spark frame itself (it never unpersists it: pass False with a frame the caller caches and
    unpersists)."""
    import warnings

    with warnings.catch_warnings():  # GX imports pyspark, which warns about pandas 3 on import; we run GX on pandas
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
        import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    present = set(frame.columns)
    skipped = []
    runnable = []
    for expectation in suite.expectations:
        column = (expectation.get("kwargs") or {}).get("column")
        if column is not None and column not in present and (expectation.get("meta") or {}).get("optional"):
            skipped.append(_entry(expectation, success=None, observed=None, skipped=f"column {column!r} not in table"))
        else:
            runnable.append({k: v for k, v in expectation.items() if k in ("type", "kwargs", "meta")})
    results = list(skipped)
    if runnable:
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        batch = (
            (context.data_sources.add_spark("lake", persist=persist) if spark else context.data_sources.add_pandas("lake"))
            .add_dataframe_asset(name="table")
            .add_batch_definition_whole_dataframe("whole")
            .get_batch(batch_parameters={"dataframe": frame})
        )
        gx_suite = context.suites.add(gx.ExpectationSuite(name=suite.name, expectations=runnable))
        outcome = batch.validate(gx_suite, result_format="SUMMARY")
        for item in outcome.results:
            config = item.expectation_config
            assert config is not None  # GX sets it on every result of a suite run
            error = (item.exception_info or {}) if isinstance(item.exception_info, dict) else {}
            message = error.get("exception_message") or next(
                (v.get("exception_message") for v in error.values() if isinstance(v, dict)), None)
            results.append(_entry({"type": config.type, "kwargs": dict(config.kwargs), "meta": dict(config.meta or {})},
                                  success=bool(item.success), observed=_observed(item.result), error=message))
    success = all(r["success"] is not False for r in results)
    return success, results


def _entry(expectation: dict[str, Any], *, success: bool | None, observed: Any, skipped: str | None = None,
           error: str | None = None) -> dict[str, Any]:
    kwargs = {k: v for k, v in (expectation.get("kwargs") or {}).items() if k != "batch_id"}
    entry = {"expectation": expectation["type"], "kwargs": kwargs, "success": success, "observed": observed}
    if skipped:
        entry["skipped"] = skipped
    if error:
        entry["error"] = error
    return _finite(json.loads(json.dumps(entry, default=_jsonable)))


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None: JSON has no such numbers (``qa --json``, the results table)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _observed(result: dict[str, Any]) -> Any:
    keep = ("observed_value", "element_count", "unexpected_count", "unexpected_percent", "partial_unexpected_list")
    return {k: result[k] for k in keep if k in result}


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
