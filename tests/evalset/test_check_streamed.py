"""``contamination(hits=...)`` streams the contaminated ids (sorted runs on disk) and keeps only ``examples`` of them:
the same counts and the same first ids (by sample_id) as the check that holds them all (``evalset check --json``
lists 20 without holding the rest)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa

from datahub.evalset import add_evalset, contamination
from datahub.lake import Lake
from tests.evalset.helpers import QUESTIONS, item_text, write_evalset
from tests.release.helpers import add_samples

LEAKED = [f"copy {i}: " + item_text(QUESTIONS[i % 3][0]) for i in range(7)]
CLEAN = [f"an ordinary training document number {i} about gardening, tools, soil and the weather" for i in range(5)]


def test_streamed_ids_keep_examples_and_exact_counts(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN + LEAKED + LEAKED[:2], "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")  # 2 ids twice
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    held = contamination(lake, batch_rows=4)
    streamed: list[pa.Table] = []
    found = contamination(lake, batch_rows=4, hits=streamed.append, examples=3)
    assert found.count == held.count == 7 and found.by_evalset == held.by_evalset == {"bench@1": 7}
    assert found.refs == dict(sorted(held.refs.items())[:3])
    ids = pa.concat_tables(streamed).column("sample_id").to_pylist()
    assert ids == sorted(held.refs) and len(ids) == 7  # one row per sample, in id order
    checked = subprocess.run([sys.executable, "-m", "datahub.cli.main", "evalset", "check", "--lake", lake.root,
                              "--json"], capture_output=True, text=True)
    assert checked.returncode == 1, checked.stderr
    out = json.loads(checked.stdout)
    assert out["contaminated"] == 7 and out["examples"] == dict(sorted(held.refs.items()))
