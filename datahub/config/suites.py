"""Great Expectations suites stored as JSON under ``schemas/gx/<name>.json`` (versioned by name)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datahub.errors import SpecError

SUITES_DIR = Path(__file__).resolve().parents[2] / "schemas" / "gx"


@dataclass(frozen=True)
class Suite:
    name: str  # e.g. "samples.v1"
    version: str
    expectations: list[dict[str, Any]]
    path: str


def available_suites(suites_dir: str | Path | None = None) -> list[str]:
    directory = Path(suites_dir or SUITES_DIR)
    return sorted(p.name[: -len(".json")] for p in directory.glob("*.json"))


def load_suite(name: str, *, suites_dir: str | Path | None = None) -> Suite:
    """Load suite ``name`` (a name under ``schemas/gx`` or a path to a JSON file)."""
    path = Path(name) if name.endswith(".json") else Path(suites_dir or SUITES_DIR) / f"{name}.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(available_suites(suites_dir)) or "none"
        raise SpecError(f"QA suite {name!r}: no file {path}; known suites: {known}") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    expectations = raw.get("expectations")
    if not isinstance(expectations, list) or not all(isinstance(e, dict) and "type" in e for e in expectations):
        raise SpecError(f"{path}: expectations: expected a list of {{type, kwargs}} objects (GX 1.x suite JSON)")
    suite_name = raw.get("name") or path.name[: -len(".json")]
    version = str((raw.get("meta") or {}).get("version") or suite_name.rsplit(".v", 1)[-1])
    return Suite(suite_name, version, expectations, str(path))
