"""``decode="structured"`` on image-text samples: the image under the lake's column names (``image``, the encoded
bytes, and ``image_format``), whatever member extension the export gave it, so one loop over all kinds reads one key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from datahub.config.spec import load_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.export import export_table_version
from datahub.lake import Lake
from datahub.loader import ReleaseDataset
from datahub.loader.decode import IMAGE_EXTENSIONS
from datahub.pipeline.run import run_job
from datahub.storage import validate_storage_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The image demo job run in-process (ArrowEngine) and its samples exported to a cfs tier."""
    root = tmp_path_factory.mktemp("structured-images")
    here = os.getcwd()
    os.chdir(REPO)
    try:
        spec = load_job_spec(REPO / "jobs/image-demo.yaml", [f"lake.root={root / 'lake'}"])
        result = run_job(spec, engine=ArrowEngine())
        assert result.status == "succeeded", result.error
    finally:
        os.chdir(here)
    lake = Lake(root / "lake")
    storage = validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": str(root / "cfs")}}}, source="t.yaml")
    manifest = export_table_version(lake, table="samples", version=lake.version("samples"), release_name="img-v1",
                                    tier="cfs", storage=storage, shard_samples=8)
    return lake, manifest, storage


def test_structured_image_text_gives_image_and_image_format(exported):
    lake, manifest, storage = exported
    kept = {r["sample_id"]: r for r in
            lake.read("samples", columns=["sample_id", "image", "image_format", "text"]).to_pylist()}
    samples = list(ReleaseDataset(manifest, storage=storage, decode="structured", shuffle=False, rank=0, world_size=1))
    assert {s["sample_id"] for s in samples} == set(kept)
    formats = set()
    for sample in samples:
        row = kept[sample["sample_id"]]
        assert sample["kind"] == "image_text" and sample["text"] == row["text"]
        assert sample["image"] == row["image"], "the encoded file byte for byte, under the lake's column name"
        assert sample["image_format"] == row["image_format"]
        assert not [e for e in IMAGE_EXTENSIONS if e in sample], "no second key for the image by member extension"
        formats.add(sample["image_format"])
    assert len(formats) >= 2, f"the demo should hold more than one format (member extensions differ): {formats}"
