"""QA gating: a table version whose latest result of any suite failed cannot be released.

Reads the ``qa_results`` table (schema ``QA_RESULTS``) directly, so releases do not depend on
``datahub.qa`` being importable: the latest row per suite for (table, version) decides. The one
source of truth for "releasable": ``datahub.qa.releasable`` asks this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from datahub.lake.lake import Lake

QA_TABLE = "qa_results"


@dataclass(frozen=True)
class QAVerdict:
    table: str
    version: int
    suites: dict[str, bool] = field(default_factory=dict)  # suite -> success of its latest result
    failed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # suite -> failed expectations

    @property
    def ran(self) -> bool:
        return bool(self.suites)

    @property
    def passed(self) -> bool:
        return self.ran and all(self.suites.values())

    @property
    def status(self) -> str:
        return "no_qa_results" if not self.ran else ("passed" if self.passed else "failed")

    def describe_failures(self) -> str:
        lines = []
        for suite, expectations in sorted(self.failed.items()):
            if not expectations:
                lines.append(f"  suite {suite}: failed (no expectation details recorded)")
            for item in expectations:
                kwargs = item.get("kwargs") or {}
                column = f" column={kwargs['column']!r}" if isinstance(kwargs, dict) and "column" in kwargs else ""
                observed = f" observed={item['observed']!r}" if item.get("observed") is not None else ""
                lines.append(f"  suite {suite}: {item.get('expectation', '?')}{column}{observed}")
        return "\n".join(lines)


def qa_command(lake: Lake, *, table: str, version: int | None = None) -> str:
    """The ``datahub qa`` command line that runs the suites on ``table`` (at ``version``, default latest)."""
    return f"datahub qa --lake {lake.ref} --table {table}" + ("" if version is None else f" --version {version}")


def qa_verdict(lake: Lake, *, table: str, version: int) -> QAVerdict:
    """The latest QA result of every suite that ran on ``table`` at ``version``."""
    if not lake.exists(QA_TABLE):
        return QAVerdict(table, version)
    rows = lake.read(QA_TABLE)
    rows = rows.filter(pc.and_(pc.equal(rows.column("table"), table), pc.equal(rows.column("table_version"), version)))
    suites: dict[str, bool] = {}
    failed: dict[str, list[dict[str, Any]]] = {}
    for row in rows.sort_by([("ts", "ascending")]).to_pylist():  # later rows win
        suites[row["suite"]] = bool(row["success"])
        if row["success"]:
            failed.pop(row["suite"], None)
        else:
            # success None = an optional expectation skipped (its column is absent): not a failure
            failed[row["suite"]] = [e for e in _results(row["results"]) if e.get("success") is False]
    return QAVerdict(table, version, suites, failed)


def _results(text: str | None) -> list[dict[str, Any]]:
    try:
        value = json.loads(text or "[]")
    except json.JSONDecodeError:
        return [{"expectation": "unparseable results JSON", "observed": (text or "")[:200]}]
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
