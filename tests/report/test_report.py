"""The HTML report: plots from a real run (lineage with dedup refs added), opened in headless chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.lake import Lake
from datahub.lake.tables import LINEAGE

PROSE = ("The module reads the files that are given to it and returns their text. It is the first "
         "step of the pipeline, and the other steps depend on it to get the data right. ") * 3
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: apt-get install -y chromium (needed by the report test in CI)")
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="module")
def lake(tmp_path_factory, ray_engine):
    from datahub.config.spec import validate_job_spec
    from datahub.pipeline.run import run_job
    from datahub.qa import run_for_job

    root = tmp_path_factory.mktemp("report")
    data = root / "docs.jsonl"
    docs = [PROSE + f"Number {i}." for i in range(12)] + ["buy cheap now " * 30, "lorem ipsum " * 60,
                                                           "Le renard brun saute par-dessus le chien paresseux. " * 12]
    data.write_text("\n".join(json.dumps({"text": t}) for t in docs) + "\n")
    spec = validate_job_spec({
        "name": "report-test", "lake": {"root": str(root / "lake")}, "inputs": [{"uri": str(data)}],
        "graph": {"gopher": {"op": "gopher_quality"}, "lang": {"op": "language_id", "after": ["gopher"]},
                  "samples": {"sink": "samples", "after": ["lang"]}},
        "qa": {"suites": ["samples.v1"]},
    })
    run_job(spec, engine=ray_engine, qa_gate=run_for_job)
    lake = Lake(root / "lake")
    # dedup drops as the dedup operator records them (its own lineage rows, same run)
    run_id = lake.read("samples").column("ingest_run_id")[0].as_py()
    ts = datetime.now(timezone.utc)
    refs = [{"cluster_id": "c1", "dup_of": "s0"}, {"cluster_id": "c1", "dup_of": "s0"}, {"dup_of": "s5"}, None]
    rows = [{"sample_id": f"d{i}", "run_id": run_id, "op": "minhash_dedup@1", "params_hash": "x", "action": "dropped",
             "reason": "near_duplicate", "ref": json.dumps(r) if r else None, "ts": ts} for i, r in enumerate(refs)]
    lake.commit("lineage", pa.Table.from_pylist(rows, LINEAGE), txn="dedup-test")
    return lake


def test_report_sections_from_lake(lake, tmp_path):
    from datahub.report import build_report, collect

    data = collect(lake)
    # spam, lorem ipsum and the French page have none of Gopher's English stop words
    assert data.drops[("gopher_quality@1", "gopher_not_enough_stop_words")] == 3
    assert data.cluster_sizes == {2: 1, 3: 1}  # c1: kept + 2 dropped; s5: kept + 1
    assert data.languages == {"en": 12}
    assert data.qa and data.qa[0].suite == "samples.v1"
    report = build_report(lake, out_dir=tmp_path / "out")
    assert set(report.plots) == {"signals", "drops", "languages", "clusters", "sources"} and not report.notes
    page = report.index.read_text()
    assert all(f"src='{p.name}'" in page for p in report.plots.values())


def test_report_without_quality_or_dedup_notes_missing_sections(tmp_path):
    from datahub.report import build_report

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", pa.table({"sample_id": ["a"], "text": ["x"], "source_uri": ["f.txt"], "ingest_run_id": ["r"]}), txn="t")
    report = build_report(lake, out_dir=tmp_path / "out")
    assert set(report.plots) == {"sources"}
    assert {"signals", "drops", "languages", "clusters"} <= set(report.notes)
    assert "no dedup drops" in report.index.read_text()


def test_report_renders_in_headless_chromium(lake, tmp_path):
    from typer.testing import CliRunner

    from datahub.cli.main import app

    browser = chromium()
    out_dir = tmp_path / "html"
    result = CliRunner().invoke(app, ["report", lake.root, "--out", str(out_dir)])
    assert result.exit_code == 0, result.output
    index = out_dir / "index.html"
    flags = CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([browser, *flags, "--dump-dom", index.as_uri()], capture_output=True, text=True, timeout=90)
    match = re.search(r"data-loaded=\"(\d+)\" data-total=\"(\d+)\"", dom.stdout)
    assert match, dom.stdout[-2000:] + dom.stderr[-2000:]
    assert match.group(1) == match.group(2) == "5"  # every <img> decoded with naturalWidth > 0
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1200,3000", index.as_uri()],
                   capture_output=True, timeout=90, check=True)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)
    assert pixels.shape[:2] == (3000, 1200)
    assert len({tuple(p) for p in pixels[::25, ::25, :3].reshape(-1, 3).round(2)}) > 20  # plots, not a blank page


def _whole_column_histogram(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the report drew before it streamed: one ``numpy.histogram`` over the whole column's finite values."""
    values = values[np.isfinite(values)]
    return np.histogram(values, bins=min(40, max(5, len(np.unique(values)))))


def _assert_streamed_histograms_match(lake, quality: pa.StructArray) -> None:
    from datahub.report import collect

    data = collect(lake, batch_rows=7)
    numeric = [f.name for f in quality.type if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    assert sorted(data.signals) == sorted(numeric)
    for name in numeric:
        column = pc.drop_null(quality.field(name)).to_numpy(zero_copy_only=False)
        values = np.asarray(column, dtype=np.float32)
        counts, edges = _whole_column_histogram(values)
        histogram = data.signals[name]
        assert histogram.edges.dtype == edges.dtype, name
        assert np.array_equal(histogram.edges, edges), name
        assert np.array_equal(histogram.counts, counts), name
        assert histogram.values == int(np.isfinite(values).sum()), name
        assert histogram.mean == pytest.approx(float(values[np.isfinite(values)].mean()), rel=1e-6), name


def test_streamed_signal_histograms_equal_whole_column_histograms(lake):
    """Histograms built batch by batch (7 rows a batch) have numpy's edges and counts for the whole column."""
    quality = lake.read("samples", columns=["quality"]).column("quality").combine_chunks()
    _assert_streamed_histograms_match(lake, quality)


def test_streamed_histograms_many_values_constants_nulls_and_nan(tmp_path):
    """Over 40 distinct values (40 bins), a constant (numpy widens its range by 0.5 each side), few distinct
    integers, nulls and non-finite values (left out), across batches of 7 rows."""
    rng = np.random.default_rng(7)
    n = 1000
    spread = rng.normal(3.0, 2.0, n).astype(np.float64)
    spread[::97] = np.nan
    spread[5] = np.inf
    quality = pa.StructArray.from_arrays(
        [pa.array(spread), pa.array(np.full(n, 0.25)), pa.array(rng.integers(0, 4, n)),
         pa.array([None if i % 3 else float(i) for i in range(n)], pa.float64()), pa.array(["en"] * n)],
        names=["spread", "constant", "few", "mostly_null", "language"])
    lake = Lake(tmp_path / "lake")
    lake.commit("samples", pa.table({"sample_id": [f"s{i}" for i in range(n)], "text": ["x"] * n,
                                     "source_uri": ["f.txt"] * n, "ingest_run_id": ["r"] * n, "quality": quality}),
                txn="t")
    _assert_streamed_histograms_match(lake, quality)
