"""`datahub runs --json` and `datahub inspect TABLE --json` print every date-time the same way: ISO 8601 in UTC with
a 'Z' and microseconds (``2026-12-07T21:58:07.876950Z``, as the export manifest's and OpenLineage's 'Z' times), for
rows of the runs table and for runs seen only through their lease alike (they printed Python's
``2026-12-07 21:58:07.876950+00:00``, and inspect gave only Delta's epoch milliseconds)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.lease import JobLease
from datahub.pipeline.run import run_job
from tests.pipeline.corpus import job_raw, make_corpus, run_cli

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def test_runs_and_inspect_json_print_iso_8601_utc_times_in_one_format(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=3)
    lake_root = tmp_path / "lake"
    before = datetime.now(timezone.utc)
    assert run_job(validate_job_spec(job_raw(corpus, lake_root)), engine=ArrowEngine()).status == "succeeded"
    killed = JobLease(Lake(lake_root), "otherjob", ttl_s=0.01).acquire()  # never released: an interrupted run
    killed.update(run_id="otherjob-0123456789ab", inputs=[])

    listed = run_cli(["runs", str(lake_root), "--json"])
    assert listed.returncode == 0, listed.stderr
    items = json.loads(listed.stdout)
    assert sorted(i["status"] for i in items) == ["interrupted", "succeeded"]
    times = [i[key] for i in items for key in ("started", "finished") if i[key] is not None]
    assert len(times) == 3 and all(ISO_UTC.match(t) for t in times), times
    assert all(datetime.fromisoformat(t) >= before.replace(microsecond=0) for t in times)  # UTC, not local time

    described = run_cli(["inspect", str(lake_root), "runs", "--json"])
    assert described.returncode == 0, described.stderr
    history = json.loads(described.stdout)["tables"]["runs"]["history"]
    assert history and all(ISO_UTC.match(h["time"]) for h in history), history
    assert all(round(datetime.fromisoformat(h["time"]).timestamp() * 1000) == h["timestamp"] for h in history)


def test_lineage_json_and_any_datetime_given_to_print_json_print_iso_8601_utc_with_z(tmp_path, capsys):
    """`lineage SAMPLE --json` printed its events' ``ts`` as ``...+00:00``; print_json (every command's --json)
    printed a datetime object as str() (``2026-12-07 22:42:20.739963+00:00``). Both now print the 'Z' form."""
    from datahub.cli.output import print_json

    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=3)
    lake_root = tmp_path / "lake"
    assert run_job(validate_job_spec(job_raw(corpus, lake_root)), engine=ArrowEngine()).status == "succeeded"
    sample_id = Lake(lake_root).read("samples", columns=["sample_id"]).column(0)[0].as_py()
    story = run_cli(["lineage", sample_id, "--lake", str(lake_root), "--json"])
    assert story.returncode == 0, story.stderr
    times = [event["ts"] for event in json.loads(story.stdout)["events"]]
    assert times and all(ISO_UTC.match(t) for t in times), times

    print_json({"created": datetime(2026, 12, 7, 22, 42, 20, 739963, tzinfo=timezone.utc),
                "naive": datetime(2026, 12, 7, 22, 42, 20, 739963)})
    assert json.loads(capsys.readouterr().out) == {"created": "2026-12-07T22:42:20.739963Z",
                                                   "naive": "2026-12-07T22:42:20.739963Z"}
