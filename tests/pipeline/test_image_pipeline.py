"""jobs/image-demo.yaml end to end on both engines: bundled real pictures, derived near-duplicates, corrupt files.

Ray and Spark keep the same samples, make the same dedup decisions and quarantine the same records; every
record read is accounted for; every corrupt file is quarantined with its reason.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest

from datahub.config.spec import load_job_spec
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)

REPO = Path(__file__).resolve().parents[2]
TRUTH = json.loads((REPO / "data/images/truth.json").read_text())


def _decisions(lake: Lake) -> dict[str, tuple[str, str]]:
    lineage = lake.read("lineage")
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped"))
    return {r["sample_id"]: (r["reason"], json.loads(r["ref"])["dup_of"]) for r in dropped.to_pylist()}


@pytest.fixture(scope="module")
def lakes(tmp_path_factory, ray_engine, spark_engine):
    import os

    root = tmp_path_factory.mktemp("image-demo")
    here = os.getcwd()
    os.chdir(REPO)  # the job names its inputs relative to the repo
    try:
        results = {}
        for name, engine in (("ray", ray_engine), ("spark", spark_engine)):
            spec = load_job_spec(REPO / "jobs/image-demo.yaml", [f"lake.root={root / name}", f"engine.kind={name}"])
            results[name] = run_job(spec, engine=engine)
            assert results[name].status == "succeeded", results[name].error
    finally:
        os.chdir(here)
    return {name: Lake(root / name) for name in results}, results


def test_ray_and_spark_keep_the_same_images(lakes):
    lake, results = lakes
    assert results["ray"].counts == results["spark"].counts
    kept = {name: sorted(lake[name].read("samples", columns=["sample_id"]).column("sample_id").to_pylist()) for name in lake}
    assert kept["ray"] == kept["spark"] and kept["ray"]
    assert _decisions(lake["ray"]) == _decisions(lake["spark"])
    images = {name: sorted(lake[name].read("samples", columns=["image_sha256"]).column("image_sha256").to_pylist())
              for name in lake}
    assert images["ray"] == images["spark"]


def test_each_picture_is_kept_once_and_corrupt_files_are_quarantined_with_reasons(lakes):
    lake, results = lakes
    samples = lake["spark"].read("samples")
    groups = Counter(TRUTH[json.loads(m)["key"]]["group"] for m in samples.column("meta").to_pylist())
    pictures = {t["group"] for t in TRUTH.values() if t["group"]}
    # every picture survives; near-duplicates derived from it (resized, re-encoded, cropped) mostly go
    assert set(groups) == pictures
    assert sum(groups.values()) <= len(pictures) + 2, groups
    quarantine = lake["spark"].read("quarantine")
    reasons = Counter(quarantine.column("reason").to_pylist())
    expected = Counter(t["reason"] for t in TRUTH.values() if t["reason"])
    assert reasons == expected
    details = " ".join(quarantine.column("detail").to_pylist())
    assert "max_pixels" in details and "truncated" in details and "missing.jpg" in details
    counts = results["spark"].counts
    assert counts["records_read"] == counts["samples_written"] + counts["dropped_total"] + counts["quarantined_total"]
    dup_reasons = {reason for reason, _ in _decisions(lake["spark"]).values()}
    assert dup_reasons == {"near_duplicate", "exact_duplicate"}  # the Parquet input repeats three shard pictures


def test_image_columns_are_typed_and_complete(lakes):
    lake, _ = lakes
    samples = lake["ray"].read("samples")
    schema = samples.schema
    assert str(schema.field("image").type) == "binary" and str(schema.field("image_width").type) == "int32"
    assert set(samples.column("kind").to_pylist()) == {"image_text"}
    assert pc.all(pc.is_valid(samples.column("image"))).as_py()
    assert set(samples.column("image_format").to_pylist()) <= {"jpeg", "png", "webp"}
