"""A run reports its phases to the progress callback, not only the ingested-rows counter: each global
operator (dedup) when it starts, then the commit (the CLI adds the QA gate)."""

from __future__ import annotations

import json

from datahub.engines.arrow import ArrowEngine
from datahub.pipeline.run import run_job


def test_global_operators_and_the_commit_are_reported_as_phases(tmp_path, job_spec):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"document {i} with a few words"}) + "\n" for i in range(4)))
    spec = job_spec(inputs=[{"uri": str(tmp_path / "a.jsonl")}],
                    graph={"exact": {"op": "exact_dedup"}, "near": {"op": "minhash_dedup", "after": ["exact"]},
                           "samples": {"sink": "samples", "after": ["near"]}})
    stages: list[str] = []
    result = run_job(spec, engine=ArrowEngine(), progress=lambda stage, done, total=None: stages.append(stage))
    assert result.status == "succeeded", result.error
    phases = list(dict.fromkeys(stages))
    assert phases == ["exact (exact_dedup)", "near (minhash_dedup)", "rows", "commit"]
