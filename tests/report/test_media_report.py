"""The report's image section on the image demo lake: histograms and contact sheets as real PNGs."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from datahub.config.spec import load_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.report.media import contact_sheet, media_plots

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The image demo job run once into a lake: (lake root, job result)."""
    root = tmp_path_factory.mktemp("image-report") / "lake"
    here = os.getcwd()
    os.chdir(REPO)
    try:
        result = run_job(load_job_spec(REPO / "jobs/image-demo.yaml", [f"lake.root={root}"]), engine=ArrowEngine())
    finally:
        os.chdir(here)
    assert result.status == "succeeded", result.error
    return root, result


def test_media_plots_of_the_image_demo(demo, tmp_path):
    root, result = demo
    plots = media_plots(Lake(root), out_dir=tmp_path / "report")
    assert set(plots) == {"image_sizes", "contact_sheet", "duplicate_clusters"}
    kept = result.counts["samples_written"]
    with Image.open(plots["contact_sheet"]) as sheet:
        assert sheet.format == "PNG" and sheet.width == 8 * 128 and sheet.height == -(-kept // 8) * (128 + 14)


def test_datahub_report_has_the_images_section(demo, tmp_path):
    """``datahub report`` on an image_text table: an Images section whose three PNGs decode with Pillow."""
    from typer.testing import CliRunner

    from datahub.cli.main import app

    root, result = demo
    out_dir = tmp_path / "html"
    cli = CliRunner().invoke(app, ["report", str(root), "--out", str(out_dir)])
    assert cli.exit_code == 0, cli.output
    page = (out_dir / "index.html").read_text()
    assert "<h2 id='images'>Images</h2>" in page
    for key in ("image_sizes", "contact_sheet", "duplicate_clusters"):
        match = re.search(rf"<img id='plot-{key}' src='([^']+)'", page)
        assert match, key
        with Image.open(out_dir / match.group(1)) as png:
            png.load()
            assert png.format == "PNG" and png.width > 100 and png.height > 100
    # one thumbnail per duplicate cluster (chains of drops followed to the keeper still in the table), each a kept sample
    lake = Lake(root)
    drops = [r for r in lake.read("lineage", columns=["sample_id", "ref", "action"]).to_pylist()
             if r["action"] == "dropped" and r["ref"] and json.loads(r["ref"]).get("dup_of")]
    # an exact copy has its keeper's sample_id (dup_of itself): only a drop as a copy of another sample is followed
    dup_of = {r["sample_id"]: json.loads(r["ref"])["dup_of"] for r in drops
              if json.loads(r["ref"])["dup_of"] != r["sample_id"]}
    kept = set(lake.read("samples", columns=["sample_id"]).column("sample_id").to_pylist())
    roots = set()
    for sample_id in {r["sample_id"] for r in drops}:
        seen = {sample_id}
        while sample_id in dup_of and dup_of[sample_id] not in seen:
            sample_id = dup_of[sample_id]
            seen.add(sample_id)
        roots.add(sample_id)
    shown = roots & kept  # a keeper a later filter dropped has no picture to show
    assert shown
    with Image.open(out_dir / "duplicate_clusters.png") as sheet:
        assert sheet.height == -(-min(len(shown), 24) // 8) * (128 + 14)


def test_text_tables_have_no_images_section(tmp_path):
    import pyarrow as pa

    from datahub.report import build_report

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", pa.table({"sample_id": ["a"], "text": ["t"]}), txn="seed/1")
    report = build_report(lake, out_dir=tmp_path / "html")
    assert "id='images'" not in report.index.read_text() and not {"image_sizes", "contact_sheet"} & set(report.plots)


def test_contact_sheet_marks_undecodable_images_grey():
    sheet = Image.open(io.BytesIO(contact_sheet([b"not an image"], columns=1, cell=32)))
    assert sheet.size == (32, 32) and sheet.getpixel((16, 16)) == (200, 200, 200)


def test_tables_without_images_have_no_media_section(tmp_path):
    import pyarrow as pa

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", pa.table({"sample_id": ["a"], "text": ["t"]}), txn="seed/1")
    assert media_plots(lake, out_dir=tmp_path / "out") == {}


def test_cluster_sizes_count_every_dropped_copy_including_exact_copies_of_a_later_dropped_keeper(tmp_path):
    """An exact copy has its keeper's sample_id (its lineage ref is dup_of itself), so one sample_id can have several
    drop rows: E's two exact copies (dup_of E) and E itself, dropped as a near copy of K (dup_of K). The cluster is
    K, K's exact copy, E and E's two copies: x5 under K. Keyed by sample_id, the last row read won: E (or K) was
    taken for its own keeper and the sheet showed K x2, or nothing for E's cluster (seen on the image demo)."""
    import pyarrow as pa

    from datahub.report.media import _largest_clusters

    def ref(keeper: str) -> str:
        return json.dumps({"dup_of": keeper})

    lake = Lake(tmp_path / "lake")
    # the near-copy row first, the exact-copy rows after it, as the demo lake's lineage has them
    rows = [("E", ref("K")), ("E", ref("E")), ("E", ref("E")), ("K", ref("K")), ("B", ref("A"))]
    lake.commit("lineage", pa.table({"action": ["dropped"] * len(rows), "run_id": ["r1"] * len(rows),
                                     "sample_id": [s for s, _ in rows], "ref": [r for _, r in rows]}), txn="seed/1")
    assert _largest_clusters(lake, ["r1"], 24) == [("K", 5), ("A", 2)]
