"""Small corpora and lake snapshots shared by the pipeline tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def docs(tag: str, n: int) -> list[str]:
    return [f"Document {tag} number {i}: the quick brown fox jumps over the lazy dog {i * 7} times." for i in range(n)]


def make_corpus(directory: Path, files: int = 3, per_file: int = 20) -> Path:
    for f in range(files):
        write_jsonl(directory / f"part-{f}.jsonl", docs(f"f{f}", per_file))
    (directory / "broken.jsonl").write_text('{"text": "fine record with enough text"}\n{not json\n')
    return directory


def job_raw(corpus: Path, lake: Path | str, *, name: str = "crashjob", storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "lake": {"root": str(lake), "storage_options": storage_options or {}},
        "inputs": [{"uri": f"{corpus}/*.jsonl"}],
        "graph": {
            "normalize": {"op": "normalize_text"},
            "samples": {"sink": "samples", "after": ["normalize"]},
        },
    }


def write_job(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_cli(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=REPO, check=False)


def snapshot(lake: Any) -> dict[str, Any]:
    """What must match between an interrupted-then-resumed lake and a clean one (timestamps excluded)."""
    out: dict[str, Any] = {}
    samples = lake.read("samples")
    out["sample_ids"] = sorted(samples.column("sample_id").to_pylist())
    out["samples"] = Counter(tuple(sorted((k, str(v)) for k, v in row.items())) for row in samples.to_pylist())
    lineage = lake.read("lineage").drop_columns(["ts"])
    out["lineage"] = Counter(tuple(r.values()) for r in lineage.to_pylist())
    quarantine = lake.read("quarantine").drop_columns(["ts"])
    out["quarantine"] = Counter(tuple(r.values()) for r in quarantine.to_pylist())
    runs = lake.read("runs")
    out["runs"] = sorted(zip(runs.column("run_id").to_pylist(), runs.column("status").to_pylist()))
    out["rows"] = {name: lake.read(name).num_rows for name in ("samples", "lineage", "quarantine", "runs")}
    return out


def data_commits(lake: Any, table: str) -> list[str]:
    """The datahub txn of every data-writing commit of ``table``, oldest first.

    A commit of files already written (add actions) that creates the table is a CREATE TABLE.
    """
    return [h["datahub.txn"] for h in reversed(lake.history(table))
            if h.get("datahub.txn") and h.get("operation") in ("WRITE", "CREATE TABLE")]
