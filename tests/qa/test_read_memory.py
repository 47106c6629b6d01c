"""QA reads a wide run that follows a long narrow run in small reads: in one row group of 20,000 short texts and
then 3,000 texts of 17 KB (the samples table holds every kind in input order), a 4,096-row read decodes the whole
wide run at once (51 MB, 151 MB of Arrow's pool at peak) whatever the batch bound; ``READ_ROWS``-row reads peak at
23 MB. The floor of any read size is one Parquet page, decompressed whole: the writers (delta-rs, pyarrow) close a
page once a write batch of 1,024 values has passed 1 MB, so 1,024 wide rows (17 MB) are one page (at 8-row reads the
peak is the same 23 MB). Measured in a subprocess (Arrow's pool peak over the QA pass), with the naive 4,096-row read
as the control in the same test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from datahub.lake import Lake

REPO = Path(__file__).resolve().parents[2]
NARROW, WIDE, WIDE_BYTES = 20_000, 3_000, 17_000
BATCH_BYTES = 2 * 2**20  # lowered in the subprocess so the bound is far below the wide run (50 MB)

PEAK = """
import json, os, sys
import pyarrow as pa
import datahub.qa.validate as validate
from datahub.lake import Lake
from datahub.qa import run_suites
validate.BATCH_BYTES, validate.READ_ROWS = int(sys.argv[2]), int(sys.argv[3])
lake = Lake(sys.argv[1])
before = pa.default_memory_pool().max_memory()
[result] = run_suites(lake, suites=["samples.v1"], commit=False)
peak = pa.default_memory_pool().max_memory() - before
print(json.dumps({"peak": peak, "observed": {e["kwargs"].get("column", ""): e["observed"] for e in result.results}}))
sys.stdout.flush()
os._exit(0)
"""


@pytest.fixture(scope="module")
def narrow_then_wide(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("narrow_then_wide") / "lake"
    texts = [f"short text number {i}" for i in range(NARROW)] + \
            [f"wide {i} " + "w" * WIDE_BYTES for i in range(WIDE)]  # distinct: plain-encoded after the dictionary
    Lake(root).commit("samples", pa.table({"sample_id": [f"{i:032x}" for i in range(len(texts))], "text": texts}),
                      txn="narrow-then-wide")
    return root


def _peak(lake: Path, read_rows: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PEAK, str(lake), str(BATCH_BYTES), str(read_rows)], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_wide_run_after_a_long_narrow_run_is_read_a_few_rows_at_a_time(narrow_then_wide):
    import datahub.qa.validate as validate

    wide_run = WIDE * WIDE_BYTES
    small = _peak(narrow_then_wide, validate.READ_ROWS)
    naive = _peak(narrow_then_wide, 4096)
    assert small["observed"] == naive["observed"]  # the same verdicts and observed values
    # one 4,096-row read takes in the whole wide run (151 MB here); 64-row reads a page and a batch (23 MB)
    assert naive["peak"] >= 2 * wide_run, ("control: the naive read no longer decodes the wide run at once", naive)
    assert small["peak"] < wide_run / 1.5, (small["peak"], wide_run)
