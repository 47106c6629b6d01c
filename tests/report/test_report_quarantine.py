"""The HTML report has a quarantine section: records quarantined by the runs that wrote the table, by reason."""

from __future__ import annotations

import json

from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.report import build_report


def test_report_lists_quarantine_reasons(tmp_path, job_spec):
    good = [f"document {i} about rivers and the towns along them" for i in range(3)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in good) + "{broken\n{also broken\n"
                                      + '{"text": null}\n')
    spec = job_spec(inputs=[{"uri": str(tmp_path / "a.jsonl")}])
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    report = build_report(Lake(spec.lake.root), out_dir=tmp_path / "report")
    html = report.index.read_text()
    section = html[html.index("<h2 id='quarantine'>"):html.index("<h2 id='qa'>")]
    assert "3 records quarantined" in section
    assert "<tr><td>invalid_json</td><td>2</td></tr>" in section and "<tr><td>missing_text_field</td><td>1</td></tr>" in section
    assert "datahub quarantine --lake" in section
