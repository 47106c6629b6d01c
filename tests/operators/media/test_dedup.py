"""image_dedup through run_job (in-process engine): ground truth of derived copies, incremental runs, keep rule."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pyarrow.compute as pc

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.kinds.media import image_text_sample_id
from tests.operators.media.conftest import image_of, shard_members


def _write(path: Path, samples: dict[str, dict[str, bytes]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _run(inputs: Path, lake: Path, params: dict | None = None):
    spec = validate_job_spec({"name": "imgdd", "lake": {"root": str(lake)},
                              "inputs": [{"uri": str(inputs / "*.tar"), "format": "webdataset", "kind": "image_text"}],
                              "limits": {"max_record_bytes": 20_000_000},
                              "graph": {"dedup": {"op": "image_dedup", "params": params or {}},
                                        "samples": {"sink": "samples", "after": ["dedup"]}}}, source="t.yaml")
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    return result


def _sample_id(members: dict[str, bytes]) -> str:
    image = image_of(members)
    return image_text_sample_id(members["txt"].decode(), hashlib.sha256(image).hexdigest())


def _dropped(lake: Lake) -> dict[str, dict]:
    lineage = lake.read("lineage")
    rows = lineage.filter(pc.equal(lineage.column("action"), "dropped")).to_pylist()
    return {r["sample_id"]: json.loads(r["ref"]) | {"reason": r["reason"]} for r in rows}


def _groups(truth: dict) -> tuple[dict[str, dict[str, bytes]], dict[str, dict[str, bytes]]]:
    members = shard_members()
    originals = {k: m for k, m in members.items() if truth[k]["transform"] == "original" and not truth[k]["reason"]}
    variants = {k: m for k, m in members.items() if truth[k]["transform"] not in ("original",) and not truth[k]["reason"]}
    return originals, variants


def test_incremental_run_drops_copies_of_images_kept_earlier(tmp_path, truth):
    originals, variants = _groups(truth)
    _write(tmp_path / "in" / "a.tar", originals)
    first = _run(tmp_path / "in", tmp_path / "lake")
    assert first.counts["samples_written"] == len(originals)
    _write(tmp_path / "in" / "b.tar", variants)
    second = _run(tmp_path / "in", tmp_path / "lake")
    lake = Lake(tmp_path / "lake")
    dropped = _dropped(lake)
    assert second.counts["records_read"] == len(variants)
    # most derived copies meet their original in the lake's image_index; none is matched to another picture
    assert len(dropped) >= 0.8 * len(variants)
    group = {_sample_id(m): truth[k]["group"] for k, m in {**originals, **variants}.items()}
    assert all(group[sid] == group[ref["dup_of"]] for sid, ref in dropped.items())
    assert all(ref["keeper_in_lake"] for ref in dropped.values())
    assert {ref["method"] for ref in dropped.values()} == {"phash"}
    index = lake.read("image_index")
    assert set(index.column("sample_id").to_pylist()) == set(lake.read("samples").column("sample_id").to_pylist())


def test_distance_zero_keeps_every_transformed_copy(tmp_path, truth):
    originals, variants = _groups(truth)
    _write(tmp_path / "in" / "a.tar", {**originals, **variants})
    strict = _run(tmp_path / "in", tmp_path / "strict", {"max_distance": 0})
    loose = _run(tmp_path / "in", tmp_path / "loose")
    assert strict.counts["samples_written"] > loose.counts["samples_written"]
    assert loose.counts["samples_written"] <= len(originals) + 2


def test_image_exact_dedup_keys_on_the_image_bytes_whatever_the_caption(tmp_path, truth):
    originals, _ = _groups(truth)
    first_key, first = next(iter(sorted(originals.items())))
    recaptioned = {**first, "txt": b"the same picture under another caption"}
    _write(tmp_path / "in" / "a.tar", {**originals, "again": recaptioned})
    spec = validate_job_spec({"name": "imgx", "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(tmp_path / "in" / "*.tar"), "format": "webdataset",
                                          "kind": "image_text"}],
                              "graph": {"exact": {"op": "image_exact_dedup"},
                                        "samples": {"sink": "samples", "after": ["exact"]}}}, source="t.yaml")
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    dropped = _dropped(Lake(tmp_path / "lake"))
    assert result.counts["dropped"] == {"exact_duplicate": 1}
    (ref,) = dropped.values()
    assert ref["method"] == "exact" and ref["cluster_id"] == "sha256:" + hashlib.sha256(image_of(first)).hexdigest()
    assert ref["dup_of"] in {_sample_id(first), _sample_id(recaptioned)}
