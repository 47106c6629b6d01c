"""`datahub report` reads the lineage's drop events streamed with scan_batches: through the dataset scanner (even with
batch_readahead=1) its pass over them held decoded row groups ahead of its slower consumer (JSON refs, the cluster
sort): 57-65 MB of the ~100 MB of lineage columns it reads here, varying run to run with thread timing (the pattern
of the CI failure fixed in 29b69cc). With scan_batches: 10.5 MB in every run, at 2 or 32 Arrow threads."""

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
from datahub.lake import Lake
from datahub.report.data import collect
lake = Lake(sys.argv[1])
before = pa.default_memory_pool().max_memory()
data = collect(lake)
peak = pa.default_memory_pool().max_memory() - before
read = lake.dataset("lineage").to_table(columns=["action", "run_id", "op", "reason", "ref"]).nbytes
print(json.dumps({"peak": peak, "lineage_bytes": read, "drops": {"/".join(k): v for k, v in data.drops.items()},
                  "clusters": sorted(data.cluster_sizes.items())}))
sys.stdout.flush()
os._exit(0)
"""


def test_the_reports_pass_over_drop_events_holds_a_batch_not_the_lineage(tmp_path):
    # 300,000 records of 3,000 texts: 297,000 exact-duplicate drops, each a lineage row with a JSON ref
    (tmp_path / "a.jsonl").write_text("".join(
        json.dumps({"text": f"duplicate document {i % 3000} about rivers, valleys and the towns along them"}) + "\n"
        for i in range(300_000)))
    spec = validate_job_spec({"name": "rep", "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(tmp_path / "a.jsonl")}],
                              "graph": {"dedup": {"op": "exact_dedup"},
                                        "samples": {"sink": "samples", "after": ["dedup"]}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    out = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "lake")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    measured = json.loads(out.stdout)
    assert measured["drops"] == {"exact_dedup@1/exact_duplicate": 297_000}
    assert measured["clusters"] == [[100, 3000]]  # 3,000 clusters of 100 members
    # the lineage's read columns are ~100 MB; scan_batches holds a batch of them and the cluster sort's run
    assert measured["peak"] < measured["lineage_bytes"] / 4, {k: measured[k] for k in ("peak", "lineage_bytes")}
