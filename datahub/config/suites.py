"""Great Expectations suites stored as JSON under ``schemas/gx/<name>.json`` (versioned by name).

Which suites ``datahub qa`` runs when none is named (``default_suites``): ``samples.v1`` always, plus each bundled
suite whose ``meta.default_when_columns`` names a column the table has (``posttraining.v1``: ``messages``,
``chosen``, ``rejected``, ``steps``, the columns of the chat, preference and trajectory kinds, when of those kinds'
types).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datahub.close_names import did_you_mean
from datahub.errors import SpecError

SUITES_DIR = Path(__file__).resolve().parents[2] / "schemas" / "gx"
DEFAULT_SUITE = "samples.v1"


@dataclass(frozen=True)
class Suite:
    name: str  # e.g. "samples.v1"
    version: str
    expectations: list[dict[str, Any]]
    path: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def default_when_columns(self) -> list[str]:
        """Table columns any of which makes ``datahub qa`` run this suite when no suite is named."""
        return [str(c) for c in self.meta.get("default_when_columns") or []]


def available_suites(suites_dir: str | Path | None = None) -> list[str]:
    directory = Path(suites_dir or SUITES_DIR)
    return sorted(p.name[: -len(".json")] for p in directory.glob("*.json"))


def load_suite(name: str, *, suites_dir: str | Path | None = None) -> Suite:
    """Load suite ``name`` (a name under ``schemas/gx`` or a path to a JSON file)."""
    path = Path(name) if name.endswith(".json") else Path(suites_dir or SUITES_DIR) / f"{name}.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        if name.endswith(".json"):
            raise SpecError(f"QA suite {name!r}: no file {path.resolve()}; check the path, or name a suite under "
                            f"{Path(suites_dir or SUITES_DIR)} ({', '.join(available_suites(suites_dir)) or 'none'})"
                            ) from None
        known = available_suites(suites_dir)
        if "/" in name or "\\" in name:  # a path, not a bundled name: the .json is what makes it one
            raise SpecError(f"QA suite {name!r}: no bundled suite of that name (no file {path}); to read a suite "
                            f"file, add .json: --suite {name}.json (bundled suites: {', '.join(known) or 'none'})"
                            ) from None
        close = did_you_mean(name, known)  # "; did you mean 'x'?" or ""
        raise SpecError(f"QA suite {name!r}: no file {path}; known suites: {', '.join(known) or 'none'}"
                        f"{close + ' Name' if close else '; name'} one of them, or a suite .json file by its path "
                        f"(GX 1.x suite JSON: {{\"name\", \"expectations\": [{{\"type\", \"kwargs\"}}]}})") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    expectations = raw.get("expectations")
    if not isinstance(expectations, list) or not all(isinstance(e, dict) and "type" in e for e in expectations):
        raise SpecError(f"{path}: expectations: expected a list of {{type, kwargs}} objects (GX 1.x suite JSON)")
    meta = raw.get("meta") or {}
    if not isinstance(meta, dict):
        raise SpecError(f"{path}: meta: expected an object, got {type(meta).__name__}")
    when = meta.get("default_when_columns")
    if when is not None and not (isinstance(when, list) and all(isinstance(c, str) for c in when)):
        raise SpecError(f"{path}: meta.default_when_columns: expected a list of column names, got {when!r}")
    suite_name = raw.get("name") or path.name[: -len(".json")]
    version = str(meta.get("version") or suite_name.rsplit(".v", 1)[-1])
    return Suite(suite_name, version, expectations, str(path), dict(meta))


def default_suites(columns: Iterable[str], *, suites_dir: str | Path | None = None) -> list[str]:
    """The suites ``datahub qa`` runs on a table with ``columns`` when none is named: ``samples.v1``, then each
    suite under ``suites_dir`` (default ``schemas/gx``) whose ``meta.default_when_columns`` names one of them.
    ``columns``: those of a type the suite can read (``datahub.qa.results.run_suites`` leaves out a ``steps`` or
    ``messages`` column of another type: ``datahub.qa.posttraining.mistyped_sources``)."""
    present = set(columns)
    chosen = [DEFAULT_SUITE]
    for name in available_suites(suites_dir):
        if name != DEFAULT_SUITE and present & set(load_suite(name, suites_dir=suites_dir).default_when_columns):
            chosen.append(name)
    return chosen
