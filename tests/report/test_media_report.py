"""The report's image section on the image demo lake: histograms and contact sheets as real PNGs."""

from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image

from datahub.config.spec import load_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.report.media import contact_sheet, media_plots

REPO = Path(__file__).resolve().parents[2]


def test_media_plots_of_the_image_demo(tmp_path):
    here = os.getcwd()
    os.chdir(REPO)
    try:
        result = run_job(load_job_spec(REPO / "jobs/image-demo.yaml", [f"lake.root={tmp_path / 'lake'}"]),
                         engine=ArrowEngine())
    finally:
        os.chdir(here)
    assert result.status == "succeeded", result.error
    plots = media_plots(Lake(tmp_path / "lake"), out_dir=tmp_path / "report")
    assert set(plots) == {"image_sizes", "contact_sheet", "duplicate_clusters"}
    kept = result.counts["samples_written"]
    with Image.open(plots["contact_sheet"]) as sheet:
        assert sheet.format == "PNG" and sheet.width == 8 * 128 and sheet.height == -(-kept // 8) * (128 + 14)


def test_contact_sheet_marks_undecodable_images_grey():
    sheet = Image.open(io.BytesIO(contact_sheet([b"not an image"], columns=1, cell=32)))
    assert sheet.size == (32, 32) and sheet.getpixel((16, 16)) == (200, 200, 200)


def test_tables_without_images_have_no_media_section(tmp_path):
    import pyarrow as pa

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", pa.table({"sample_id": ["a"], "text": ["t"]}), txn="seed/1")
    assert media_plots(lake, out_dir=tmp_path / "out") == {}
