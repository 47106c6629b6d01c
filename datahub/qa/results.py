"""QA results: run suites on a table version, record them in ``qa_results``, read them back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from datahub.engines.base import Engine
from datahub.engines.registry import engine_in_scope
from datahub.errors import SpecError
from datahub.lake.lake import Lake
from datahub.lake.tables import QA_RESULTS
from datahub.progress import Progress
from datahub.qa.engine import run_suites_on_ray, run_suites_on_spark
from datahub.qa.posttraining import mistyped_sources

QA_TABLE = "qa_results"


@dataclass(frozen=True)
class QAResult:
    """One suite's outcome on one table version."""

    run_id: str
    table: str
    table_version: int
    suite: str
    suite_version: str
    success: bool
    results: list[dict[str, Any]] = field(default_factory=list)
    ts: datetime | None = None

    @property
    def failed_expectations(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r.get("success") is False]

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "failed_expectations": self.failed_expectations}


def run_suite(
    lake: Lake,
    *,
    suite: str,
    table: str = "samples",
    version: int | None = None,
    run_id: str | None = None,
    commit: bool = True,
    suites_dir: str | Path | None = None,
) -> QAResult:
    """Validate ``table`` at ``version`` (default: latest) against ``suite``; record it unless ``commit=False``."""
    return run_suites(lake, suites=[suite], table=table, version=version, run_id=run_id, commit=commit,
                      suites_dir=suites_dir)[0]


def table_default_suites(lake: Lake, *, table: str, version: int | None = None,
                         suites_dir: str | Path | None = None) -> list[str]:
    """The suites ``datahub qa`` runs on ``table`` at ``version`` (default latest) when none is named, from the
    version's schema (the Delta log and one footer: no rows read): ``samples.v1``, plus ``posttraining.v1`` on chat,
    preference or trajectory columns of the types its derived columns read (a ``steps`` count is none)."""
    from datahub.config.suites import default_suites

    schema = pa.schema(lake.dataset(table, version).schema)
    wrong = mistyped_sources(schema)
    return default_suites([n for n in schema.names if n not in wrong], suites_dir=suites_dir)


def run_suites(
    lake: Lake,
    *,
    suites: Sequence[str] | None = None,
    table: str = "samples",
    version: int | None = None,
    run_id: str | None = None,
    commit: bool = True,
    suites_dir: str | Path | None = None,
    engine: Literal["local", "ray", "spark"] | Engine = "local",
    progress: Progress | None = None,
) -> list[QAResult]:
    """Run several suites on one table version: one streaming pass over the columns they name, in bounded
    memory (``datahub.qa.validate.run_suites_streaming``), or on an engine (``datahub.qa.engine``: Ray tasks
    computing the same aggregates per file, or Great Expectations' Spark engine on a Spark DataFrame). A named
    engine is started here (embedded, local) and stopped after; pass a started ``Engine`` to use a cluster.
    ``progress(stage, done, total)`` follows the local pass's rows (called from no engine pass).
    ``suites=None``: the table's default suites (``datahub.config.suites.default_suites``: ``samples.v1``, plus
    ``posttraining.v1`` on a table with chat, preference or trajectory columns)."""
    from datahub.config.suites import load_suite
    from datahub.qa.validate import run_suites_streaming

    if suites is not None:
        loaded = [load_suite(name, suites_dir=suites_dir) for name in suites]  # bad names fail before reading
    if version is None:
        version = int(lake.table(table).version())
    if suites is None:
        names = table_default_suites(lake, table=table, version=version, suites_dir=suites_dir)
        loaded = [load_suite(name, suites_dir=suites_dir) for name in names]
    with ExitStack() as scope:
        running = engine_in_scope(engine, scope, purpose="QA")
        if running is None:
            dataset = lake.dataset(table, version)
            outcomes = run_suites_streaming(dataset, loaded, total_rows=dataset.count_rows(),  # rows from footers
                                            progress=progress)
        elif running.name == "ray":
            outcomes = run_suites_on_ray(running, lake, loaded, table=table, version=version)
        else:
            outcomes = run_suites_on_spark(running, lake, loaded, table=table, version=version)
    run_id = run_id or f"qa-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%fZ')}"
    out = []
    for s, (success, results) in zip(loaded, outcomes):
        result = QAResult(run_id, table, version, s.name, s.version, success, results, datetime.now(timezone.utc))
        if commit:
            record(lake, result)
        out.append(result)
    return out


def record(lake: Lake, result: QAResult) -> int | None:
    """Commit one result row; idempotent per (run, table, version, suite)."""
    row = {**{k: getattr(result, k) for k in QA_RESULTS.names if k != "results"}, "results": json.dumps(result.results)}
    txn = f"qa/{result.run_id}/{result.table}@{result.table_version}/{result.suite}"
    return lake.commit(QA_TABLE, pa.Table.from_pylist([row], QA_RESULTS), txn=txn,
                       metadata={"datahub.run_id": result.run_id})


def results_for(lake: Lake, *, table: str, version: int) -> list[QAResult]:
    """The latest recorded result of each suite for ``table`` at ``version`` (sorted by suite)."""
    if not lake.exists(QA_TABLE):
        return []
    rows = lake.read(QA_TABLE, filters=(pc.field("table") == table) & (pc.field("table_version") == version))
    latest: dict[str, dict[str, Any]] = {}
    for row in rows.sort_by([("ts", "ascending")]).to_pylist():
        latest[row["suite"]] = row
    return [
        QAResult(r["run_id"], r["table"], int(r["table_version"]), r["suite"], r["suite_version"], bool(r["success"]),
                 json.loads(r["results"] or "[]"), r["ts"])
        for _, r in sorted(latest.items())
    ]


def releasable(lake: Lake, *, table: str, version: int, required: Sequence[str] = ()) -> bool:
    """True when at least one suite ran on this version, the latest run of each passed, and every
    suite in ``required`` is among them. The release gate (``datahub.release.qa_gate``) decides."""
    from datahub.release.qa_gate import qa_verdict

    verdict = qa_verdict(lake, table=table, version=version)
    return verdict.passed and set(required) <= set(verdict.suites)


def run_for_job(lake: Lake, *, suites: Sequence[str] | None, table: str, version: int | None,
                run_id: str) -> dict[str, Any]:
    """What ``run_job`` calls after its samples commit: run the job's suites (None: the table's default suites,
    as ``datahub qa`` picks them), return counts."""
    if version is None:  # nothing new committed (a re-run, or every row dropped): check the current version
        if not lake.exists(table):
            return {"table": table, "table_version": None, "success": None, "suites": {}, "skipped": "no table"}
        version = int(lake.table(table).version())
    results = run_suites(lake, suites=suites, table=table, version=version, run_id=run_id)
    return {
        "table": table,
        "table_version": version,
        "success": all(r.success for r in results),
        "suites": {r.suite: {"success": r.success, "failed": len(r.failed_expectations)} for r in results},
    }
