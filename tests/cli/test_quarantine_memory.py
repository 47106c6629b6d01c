"""`datahub quarantine` streams the table: it counted reasons and picked its 3 examples per reason from whole-table
reads, and since the examples show the record's first bytes that read took `raw` (up to 4 KB a row) of every
quarantined row (review finding on 16d92f4: a crawl with 2M bad records read ~8 GB to print 3 previews)."""

from __future__ import annotations

import json
import subprocess
import sys

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.pipeline.run import run_job

PEAK = """
import json, os, sys
import pyarrow as pa
from datahub.cli.commands.quarantine import quarantine_summary
from datahub.lake import Lake
pool = pa.default_memory_pool()
before = pool.max_memory()
summary = quarantine_summary(sys.argv[1])
peak = pool.max_memory() - before
raw_bytes = Lake(sys.argv[1]).dataset("quarantine").to_table(columns=["raw"]).nbytes
print(json.dumps({"peak": peak, "raw_bytes": raw_bytes, "summary": summary}, default=str))
sys.stdout.flush()
os._exit(0)
"""


def test_the_summary_of_a_large_quarantine_reads_raw_of_its_examples_only(tmp_path):
    bad = "{not json " + "x" * 3000
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "one good record about rivers"}) + "\n"
                                      + "".join(f"{bad} {i}\n" for i in range(30_000)))
    spec = validate_job_spec({"name": "bad", "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(tmp_path / "a.jsonl")}], "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    out = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "lake")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    measured = json.loads(out.stdout)
    (item,) = measured["summary"]["reasons"]
    assert item["reason"] == "invalid_json" and item["records"] == 30_000
    assert [e["source_offset"] for e in item["examples"]] == [2, 3, 4]
    assert item["examples"][0]["raw_preview"].startswith("{not json xxx")
    # ~90 MB of raw in the table; the summary holds a batch of keys and the examples' rows
    assert measured["peak"] < measured["raw_bytes"] / 4, {k: v for k, v in measured.items() if k != "summary"}
