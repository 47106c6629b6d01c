"""`datahub report` reads the lineage's drop events streamed with scan_batches: through the dataset scanner (even with
batch_readahead=1) its pass over them held decoded row groups ahead of its slower consumer (JSON refs, the cluster
sort): 57-65 MB of the ~100 MB of lineage columns it reads here, varying run to run with thread timing (the pattern
of the CI failure fixed in 29b69cc). With scan_batches: 10.5 MB in every run, at 2 or 32 Arrow threads. The image
section's largest-clusters pass read the same events the same way (63-68 MB; now 10.2 MB), and its contact sheet took
its first 48 images with Dataset.head, which decoded whole row groups of images of several files (100-252 MB of a
100 MB image column; now 16 MB for the whole image section)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


CLUSTERS_PEAK = """
import json, os, sys
import pyarrow as pa
from datahub.lake import Lake
from datahub.report.media import _largest_clusters
lake = Lake(sys.argv[1])
runs = sorted(set(lake.read("runs", columns=["run_id"]).column("run_id").to_pylist()))
before = pa.default_memory_pool().max_memory()
top = _largest_clusters(lake, runs, 5)
peak = pa.default_memory_pool().max_memory() - before
read = lake.dataset("lineage").to_table(columns=["action", "run_id", "sample_id", "ref"]).nbytes
print(json.dumps({"peak": peak, "lineage_bytes": read, "top": top}))
sys.stdout.flush()
os._exit(0)
"""


@pytest.fixture(scope="module")
def dropped_lake(tmp_path_factory) -> Path:
    """300,000 records of 3,000 texts: 297,000 exact-duplicate drops, each a lineage row with a JSON ref."""
    root = tmp_path_factory.mktemp("dropped")
    (root / "a.jsonl").write_text("".join(
        json.dumps({"text": f"duplicate document {i % 3000} about rivers, valleys and the towns along them"}) + "\n"
        for i in range(300_000)))
    spec = validate_job_spec({"name": "rep", "lake": {"root": str(root / "lake")},
                              "inputs": [{"uri": str(root / "a.jsonl")}],
                              "graph": {"dedup": {"op": "exact_dedup"},
                                        "samples": {"sink": "samples", "after": ["dedup"]}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    return root / "lake"


def _measure(script: str, lake: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", script, str(lake)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_reports_pass_over_drop_events_holds_a_batch_not_the_lineage(dropped_lake):
    measured = _measure(PEAK, dropped_lake)
    assert measured["drops"] == {"exact_dedup@1/exact_duplicate": 297_000}
    assert measured["clusters"] == [[100, 3000]]  # 3,000 clusters of 100 members
    # the lineage's read columns are ~100 MB; scan_batches holds a batch of them and the cluster sort's run
    assert measured["peak"] < measured["lineage_bytes"] / 4, {k: measured[k] for k in ("peak", "lineage_bytes")}


def test_the_image_sections_cluster_pass_holds_a_batch_not_the_lineage(dropped_lake):
    measured = _measure(CLUSTERS_PEAK, dropped_lake)
    assert len(measured["top"]) == 5 and all(n >= 2 for _, n in measured["top"])
    # 63-68 MB through the dataset scanner; 10.2 MB with scan_batches (16,384-row batches of four columns)
    assert measured["peak"] < measured["lineage_bytes"] / 4, {k: measured[k] for k in ("peak", "lineage_bytes")}


IMAGES_PEAK = """
import json, os, sys, tempfile
import pyarrow as pa
from datahub.lake import Lake
from datahub.report.media import media_plots
lake = Lake(sys.argv[1])
before = pa.default_memory_pool().max_memory()
plots = media_plots(lake, out_dir=tempfile.mkdtemp())
peak = pa.default_memory_pool().max_memory() - before
images = lake.dataset("samples").to_table(columns=["image"]).nbytes
print(json.dumps({"peak": peak, "images": images, "plots": sorted(plots)}))
sys.stdout.flush()
os._exit(0)
"""


def test_the_image_section_holds_a_few_images_not_row_groups_of_them(tmp_path):
    """Four files of 500 rows with 50 KB images (100 MB, one row group each) and 24 dropped duplicates whose
    keepers are spread over them: the contact sheet's 48 images and the 24 keepers' are read a few at a time."""
    import os

    import pyarrow as pa

    from datahub.lake import Lake

    lake = Lake(tmp_path / "lake")
    keepers: list[str] = []
    for f in range(4):
        ids = [f"{f:02x}{i:030x}" for i in range(500)]
        keepers += ids[::84][:6]
        lake.commit("samples", pa.table({"sample_id": ids, "image": [os.urandom(50_000) for _ in ids],
                                         "image_width": pa.array([64] * 500, pa.int32()),
                                         "image_height": pa.array([48] * 500, pa.int32()),
                                         "text": ["a caption"] * 500, "ingest_run_id": ["r1"] * 500}), txn=f"s{f}")
    lake.commit("lineage", pa.table({"sample_id": [f"dd{i:030x}" for i in range(24)], "run_id": ["r1"] * 24,
                                     "action": ["dropped"] * 24,
                                     "ref": [json.dumps({"dup_of": k}) for k in keepers]}), txn="l0")
    measured = _measure(IMAGES_PEAK, tmp_path / "lake")
    assert measured["plots"] == ["contact_sheet", "duplicate_clusters", "image_sizes"]
    assert measured["peak"] < measured["images"] / 4, {k: measured[k] for k in ("peak", "images")}
