"""Run one suite on one table version with a Great Expectations 1.x ephemeral context.

great_expectations and pandas are imported here only, when a suite actually runs.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.config.suites import Suite


def validation_frame(table: pa.Table) -> Any:
    """The pandas frame suites see: the table's flat columns plus derived ones.

    ``text_length`` (characters), ``text_id`` (equal texts share an id, so the proportion of
    unique ids is 1 - exact-duplicate rate) and ``quality_<signal>`` per quality struct field.
    """
    columns: dict[str, Any] = {}
    for name in table.column_names:
        column = table.column(name)
        if name == "quality" and pa.types.is_struct(column.type):
            struct = column.combine_chunks()
            for i, field in enumerate(struct.type):
                columns[f"quality_{field.name}"] = struct.field(i)
        elif not pa.types.is_nested(column.type):
            columns[name] = column
    if "text" in table.column_names:
        text = table.column("text").combine_chunks()
        columns["text_length"] = pc.utf8_length(text)
        columns["text_id"] = pc.dictionary_encode(text).indices if len(text) else pa.array([], pa.int32())
    return pa.table(columns).to_pandas()


def run_expectations(frame: Any, suite: Suite) -> tuple[bool, list[dict[str, Any]]]:
    """Validate ``frame`` against ``suite``; returns (success, one JSON-able dict per expectation)."""
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
            context.data_sources.add_pandas("lake")
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
    return json.loads(json.dumps(entry, default=_jsonable))


def _observed(result: dict[str, Any]) -> Any:
    keep = ("observed_value", "element_count", "unexpected_count", "unexpected_percent", "partial_unexpected_list")
    return {k: result[k] for k in keep if k in result}


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
