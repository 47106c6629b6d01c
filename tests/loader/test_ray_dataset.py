"""ray_dataset yields every sample of the release once, with text and metadata columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.loader.shards import all_ids, write_release

ray = pytest.importorskip("ray")


def test_ray_dataset_reads_all_samples(tmp_path: Path, ray_engine: object) -> None:
    from datahub.loader import ray_dataset

    manifest = write_release(tmp_path, samples_per_shard=(4, 3, 2))
    rows = ray_dataset(str(tmp_path / "manifest.json"), shuffle_seed=0).take_all()
    assert sorted(row["sample_id"] for row in rows) == all_ids(manifest)
    row = rows[0]
    assert json.loads(row["meta"])["sample_id"] == row["sample_id"] and row["text"].startswith("sample")
