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


def test_the_quarantine_command_in_the_report_is_quoted_for_a_lake_path_with_spaces(tmp_path, job_spec):
    """The section names `datahub quarantine --lake LAKE` for the examples; with the lake in 'my lakes/' the path was
    printed bare, so the command copied from the page looked for a lake 'my'."""
    import html
    import re
    import shlex

    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "a document about rivers and towns"}) + "\n{broken\n")
    root = tmp_path / "my lakes" / "it's here"
    spec = job_spec(inputs=[{"uri": str(tmp_path / "a.jsonl")}], lake_root=root)
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    page = build_report(Lake(spec.lake.root), out_dir=tmp_path / "report").index.read_text()
    (command,) = re.findall(r"examples: <code>([^<]*)</code>", page)
    assert shlex.split(html.unescape(command)) == ["datahub", "quarantine", "--lake", str(root)]


def test_a_lake_whose_runs_quarantined_every_record_names_the_quarantine_command(tmp_path, job_spec):
    """A first run whose every record was quarantined writes no samples table: the report said only "no Delta table
    'samples' ... (its tables: lineage, quarantine, runs; datahub inspect ...)", not why or where to look."""
    import pytest

    from datahub.errors import LakeError

    (tmp_path / "a.jsonl").write_text("{broken\n" + json.dumps({"no_text": 1}) + "\n")
    spec = job_spec(inputs=[{"uri": str(tmp_path / "a.jsonl")}])
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = Lake(spec.lake.root)
    assert not lake.exists("samples") and lake.exists("quarantine")
    with pytest.raises(LakeError) as refused:
        build_report(lake, out_dir=tmp_path / "report")
    message = str(refused.value)
    assert "no sample was written" in message and "2 records quarantined" in message, message
    assert f"datahub quarantine --lake {lake.ref}" in message, message
