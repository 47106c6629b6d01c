"""Job leases on a local lake and on real Ceph S3: refuse, expire, take over a dead holder, heartbeat."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from datahub.errors import RunLockedError
from datahub.lake import Lake
from datahub.pipeline.lease import JobLease, list_leases, read_lease
from datahub.pipeline.run import run_job
from tests.ceph import ceph_s3  # noqa: F401


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_second_holder_is_refused_with_a_clear_message(tmp_path):
    lake = Lake(tmp_path / "lake")
    with JobLease(lake, "demo", ttl_s=30) as first:
        first.update(run_id="demo-abc")
        with pytest.raises(RunLockedError) as error:
            JobLease(lake, "demo").acquire()
        message = str(error.value)
        assert "job 'demo' is already running" in message and "run demo-abc" in message
        assert f"{lake.root}/_leases/demo.json" in message
        JobLease(lake, "other-job").acquire().release()  # leases are per job
    assert read_lease(lake, "demo") is None
    JobLease(lake, "demo").acquire().release()  # free again after release


def test_lease_of_a_dead_process_on_this_host_is_taken_over(tmp_path):
    lake = Lake(tmp_path / "lake")
    lease = JobLease(lake, "demo", ttl_s=3600).acquire()
    path = tmp_path / "lake" / "_leases" / "demo.json"
    raw = json.loads(path.read_text())
    raw["pid"] = _dead_pid()
    path.write_text(json.dumps(raw, sort_keys=True))
    assert read_lease(lake, "demo").is_stale()
    taker = JobLease(lake, "demo").acquire()
    assert taker.took_over is not None and taker.took_over.pid == raw["pid"]
    # the original holder finds out at its next renewal and must not commit any more
    with pytest.raises(RunLockedError, match="lost the lease"):
        lease.renew()
    with pytest.raises(RunLockedError):
        lease.ensure_held()
    lease.release()  # must not delete the new holder's lease
    assert read_lease(lake, "demo").owner == taker.info.owner
    taker.release()


def test_expired_lease_of_another_host_is_taken_over_and_live_one_is_not(tmp_path):
    lake = Lake(tmp_path / "lake")
    JobLease(lake, "demo", ttl_s=2.0).acquire()  # never renewed, never released (2 s: a loaded CI machine stalls)
    path = tmp_path / "lake" / "_leases" / "demo.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "host": "some-other-pod"}, sort_keys=True))
    with pytest.raises(RunLockedError):
        JobLease(lake, "demo").acquire()
    time.sleep(2.1)
    JobLease(lake, "demo").acquire().release()


def test_heartbeat_keeps_a_short_lease_alive(tmp_path):
    lake = Lake(tmp_path / "lake")
    with JobLease(lake, "demo", ttl_s=1.5):
        first = read_lease(lake, "demo").expires
        time.sleep(2.5)  # longer than the ttl: only renewals (every ttl/4) keep it valid
        current = read_lease(lake, "demo")
        assert current.expires > first and not current.is_stale()
        with pytest.raises(RunLockedError):
            JobLease(lake, "demo").acquire()


def test_racing_takeovers_have_exactly_one_winner(tmp_path):
    lake_root = tmp_path / "lake"
    lake = Lake(lake_root)
    JobLease(lake, "demo").acquire()
    path = lake_root / "_leases" / "demo.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": _dead_pid()}, sort_keys=True))
    script = (
        "import sys, time; from datahub.lake import Lake; from datahub.pipeline.lease import JobLease\n"
        "from datahub.errors import RunLockedError\n"
        f"time.sleep(max(0, {time.time() + 1.5} - time.time()))\n"
        "try:\n    JobLease(Lake(sys.argv[1]), 'demo', ttl_s=60).acquire(); print('won')\n"
        "except RunLockedError: print('lost')\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(lake_root)], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["lost", "lost", "lost", "won"]


def test_lease_on_ceph_s3(ceph_s3):  # noqa: F811
    lake = Lake(f"s3://{ceph_s3.new_bucket('lease')}/lake", storage_options=ceph_s3.storage_options())
    # ttl 3 s, renewed every 0.75 s: wide enough that a slow PUT on a loaded CI machine never lets it lapse
    with JobLease(lake, "demo", ttl_s=3.0) as held:
        with pytest.raises(RunLockedError, match="already running"):
            JobLease(lake, "demo").acquire()
        time.sleep(4.0)  # outlives the first expiry: only the heartbeat's conditional PUTs (If-Match) keep it
        assert not read_lease(lake, "demo").is_stale()
        assert [lease.owner for lease in list_leases(lake)] == [held.info.owner]
    assert read_lease(lake, "demo") is None
    stale = JobLease(lake, "demo", ttl_s=0.2).acquire()  # left behind, expires
    time.sleep(0.3)
    taker = JobLease(lake, "demo").acquire()
    assert taker.took_over is not None and taker.took_over.owner == stale.info.owner
    taker.release()


def test_taking_over_a_failed_runs_lease_names_it_not_an_expiry_of_1970(tmp_path, caplog):
    """A failed run leaves its lease behind expired (expires 0, plan kept for the resume): the next run's log line
    says it was left by a failed run, not 'expires 1970-01-01T00:00:00Z unless renewed'; a holder whose process is gone
    keeps its real expiry in the line."""
    import logging

    lake = Lake(tmp_path / "lake")
    with pytest.raises(RuntimeError):
        with JobLease(lake, "demo", ttl_s=30) as failing:
            failing.update(run_id="demo-abc", inputs=[["a.jsonl", 3, "1"]])
            raise RuntimeError("the run failed")
    assert read_lease(lake, "demo").expires == 0.0
    with caplog.at_level(logging.WARNING, logger="datahub.pipeline.lease"):
        JobLease(lake, "demo").acquire().release()
    text = caplog.text
    assert "1970" not in text and "unless renewed" not in text
    assert "took over the lease left by a failed or interrupted run of job 'demo'" in text
    assert "resuming" not in text  # what resumes is decided by run_job (pending_run), which says so itself

    caplog.clear()
    gone = JobLease(lake, "demo", ttl_s=3600).acquire()
    path = tmp_path / "lake" / "_leases" / "demo.json"
    raw = json.loads(path.read_text())
    raw["pid"] = _dead_pid()
    path.write_text(json.dumps(raw, sort_keys=True))
    with caplog.at_level(logging.WARNING, logger="datahub.pipeline.lease"):
        JobLease(lake, "demo").acquire().release()
    expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(raw["expires"]))
    assert "took over stale lease" in caplog.text and f"expires {expiry}" in caplog.text
    gone.release()


def test_a_run_that_fails_before_its_first_commit_releases_its_lease(tmp_path, monkeypatch, caplog):
    """A run that raises (or is interrupted with Ctrl-C) before committing anything has nothing to complete: it
    deletes its lease, so the next run takes over nothing, `runs` lists no 'interrupted (killed?)' run, and an error
    before the plan (an input matching no file) leaves no lease at all. A failure once commits have begun keeps the
    lease behind with its plan (test_crash_safety.py::test_failed_run_leaves_its_plan_in_the_lease), as a kill does."""
    import logging

    import datahub.pipeline.run as run_module
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.errors import SpecError
    from datahub.pipeline.faults import KILL_AT_ENV
    from datahub.pipeline.history import list_runs
    from tests.pipeline.corpus import job_raw, make_corpus

    lake_root = tmp_path / "lake"
    lease_path = lake_root / "_leases" / "crashjob.json"
    spec = validate_job_spec(job_raw(tmp_path / "corpus", lake_root))
    with pytest.raises(SpecError, match="matches no file"):  # before the plan: no run id yet
        run_job(spec, engine=ArrowEngine())
    assert not lease_path.exists()
    assert list_runs(Lake(lake_root)) == []

    make_corpus(tmp_path / "corpus", files=2, per_file=5)
    real_execute = run_module.execute_graph

    def fails_after_the_graph(*args, **kwargs):
        real_execute(*args, **kwargs)  # everything staged, nothing committed
        raise RuntimeError("an operator failed")

    monkeypatch.setattr(run_module, "execute_graph", fails_after_the_graph)
    with pytest.raises(RuntimeError, match="an operator failed"):
        run_job(spec, engine=ArrowEngine())
    assert not lease_path.exists()
    listed = list_runs(Lake(lake_root))
    assert [r["status"] for r in listed] == ["failed"], listed  # its runs row says how to re-run; no lease entry
    failed_id = listed[0]["run_id"]
    monkeypatch.setattr(run_module, "execute_graph", real_execute)

    monkeypatch.setenv(KILL_AT_ENV, "after_graph@SIGINT")  # Ctrl-C before the first commit
    with pytest.raises(KeyboardInterrupt):
        run_job(spec, engine=ArrowEngine())
    monkeypatch.delenv(KILL_AT_ENV)
    assert not lease_path.exists()
    assert [r["status"] for r in list_runs(Lake(lake_root))] == ["failed"]

    with caplog.at_level(logging.WARNING, logger="datahub.pipeline"):
        result = run_job(spec, engine=ArrowEngine())
    assert "took over" not in caplog.text
    assert result.status == "succeeded" and result.run_id == failed_id
    assert not lease_path.exists()
    assert [r["status"] for r in list_runs(Lake(lake_root))] == ["failed (resumed)", "succeeded"]


def test_a_takeover_keeps_the_plan_it_took_over_until_its_own_plan_replaces_it(tmp_path):
    """The run that takes over a killed holder's lease knows that holder's plan only in memory until it writes its own
    (run_job's first lease.update): dying or failing in between (reading the runs table with storage down) left its own
    lease without any plan, so the run after it no longer knew which run to complete (new input meanwhile: another
    run id, the killed run's committed samples ingested again). The takeover now carries the plan over."""
    lake = Lake(tmp_path / "lake")
    killed = JobLease(lake, "demo", ttl_s=0.05).acquire()
    killed.update(run_id="demo-0123456789ab", inputs=[["a.jsonl", 3, "1"]], run_full=False, job_hash="h1")
    time.sleep(0.1)  # never released, expired: as after a SIGKILL on another host
    with pytest.raises(OSError):
        with JobLease(lake, "demo") as taker:
            assert taker.took_over is not None and taker.took_over.run_id == "demo-0123456789ab"
            raise OSError("storage down while reading the runs table")
    left = read_lease(lake, "demo")
    assert left is not None and left.is_stale()
    assert (left.run_id, left.inputs, left.run_full, left.job_hash) == ("demo-0123456789ab", [["a.jsonl", 3, "1"]],
                                                                        False, "h1")
    assert left.owner != killed.info.owner


_KILLED_RUN = ("import sys, yaml; from datahub.config.spec import validate_job_spec; "
               "from datahub.engines.arrow import ArrowEngine; from datahub.pipeline.run import run_job; "
               "run_job(validate_job_spec(yaml.safe_load(open(sys.argv[1]))), engine=ArrowEngine())")


@pytest.mark.parametrize("interruption", ["ctrl-c", "raise"])
def test_a_run_completing_a_killed_run_keeps_its_plan_when_stopped_before_the_commit(tmp_path, monkeypatch,
                                                                                   interruption):
    """A run killed after committing samples has no runs row: only its lease holds its plan (run id, input files).
    The run that completes it and is stopped before its own commit (Ctrl-C after the graph, or an operator failing)
    must leave that plan in the lease: with new input meanwhile, the next run would otherwise compute another run id
    and ingest the killed run's committed files again (duplicate samples)."""
    import os
    import signal

    import yaml

    import datahub.pipeline.run as run_module
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.faults import KILL_AT_ENV
    from tests.pipeline.corpus import REPO, docs, job_raw, make_corpus, write_jsonl

    corpus = make_corpus(tmp_path / "corpus", files=2, per_file=5)
    lake_root = tmp_path / "lake"
    raw = job_raw(corpus, lake_root)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(raw))
    killed = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(job)], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, KILL_AT_ENV: "after_commit:samples", "PYTHONPATH": str(REPO)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    killed_plan = read_lease(Lake(lake_root), "crashjob")
    assert killed_plan is not None and killed_plan.run_id
    write_jsonl(corpus / "part-9.jsonl", docs("new", 4))  # new input arrives before the next run
    spec = validate_job_spec(raw)
    if interruption == "ctrl-c":
        monkeypatch.setenv(KILL_AT_ENV, "after_graph@SIGINT")
        with pytest.raises(KeyboardInterrupt):
            run_job(spec, engine=ArrowEngine())
        monkeypatch.delenv(KILL_AT_ENV)
    else:
        real_execute = run_module.execute_graph

        def fails_after_the_graph(*args, **kwargs):
            real_execute(*args, **kwargs)
            raise RuntimeError("an operator failed")

        monkeypatch.setattr(run_module, "execute_graph", fails_after_the_graph)
        with pytest.raises(RuntimeError, match="an operator failed"):
            run_job(spec, engine=ArrowEngine())
        monkeypatch.setattr(run_module, "execute_graph", real_execute)
    kept = read_lease(Lake(lake_root), "crashjob")
    if interruption == "ctrl-c":  # no runs row was written: the lease is the only record of the plan
        assert kept is not None and kept.run_id == killed_plan.run_id and kept.inputs == killed_plan.inputs
    result = run_job(spec, engine=ArrowEngine())
    ids = Lake(lake_root).read("samples").column("sample_id").to_pylist()
    # 2 files x 5 + broken.jsonl's one good record + 4 new: what one clean run gives
    assert len(ids) == len(set(ids)) == 15, f"{len(ids)} rows, {len(set(ids))} unique"
    assert (result.resumed or {}).get("run_id") == killed_plan.run_id or result.run_id == killed_plan.run_id, result


@pytest.mark.parametrize("failure", ["engine does not start", "runs table unreadable"])
def test_a_run_completing_a_killed_run_keeps_its_plan_when_it_fails_before_starting(tmp_path, monkeypatch, failure):
    """A run that takes over a SIGKILLed run's lease (the killed run's plan only in the lease: no runs row) and fails
    before it starts that run (its engine does not start, the runs table cannot be read) keeps the plan in the lease:
    with ``keep_on_failure`` off the lease was deleted, and the next run with new input computed another run id and
    ingested the killed run's committed files again."""
    import os
    import signal

    import yaml

    import datahub.pipeline.run as run_module
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.faults import KILL_AT_ENV
    from tests.pipeline.corpus import REPO, docs, job_raw, make_corpus, write_jsonl

    corpus = make_corpus(tmp_path / "corpus", files=2, per_file=5)
    lake_root = tmp_path / "lake"
    raw = job_raw(corpus, lake_root)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(raw))
    killed = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(job)], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, KILL_AT_ENV: "after_commit:samples", "PYTHONPATH": str(REPO)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    killed_plan = read_lease(Lake(lake_root), "crashjob")
    assert killed_plan is not None and killed_plan.run_id and killed_plan.inputs
    spec = validate_job_spec(raw)
    with monkeypatch.context() as patch:
        if failure == "engine does not start":
            class NoAnswer(ArrowEngine):
                def start(self) -> None:
                    raise ConnectionError("ray cluster at ray://x:10001 did not answer")

            patch.setattr(run_module, "make_engine", lambda config: NoAnswer())
            with pytest.raises(ConnectionError):
                run_job(spec)  # no engine passed: run_job starts its own to complete the killed run
        else:
            real_read = Lake.read

            def runs_unreadable(self, table, *args, **kwargs):
                if table == "runs":
                    raise OSError("storage did not answer reading the runs table")
                return real_read(self, table, *args, **kwargs)

            patch.setattr(Lake, "read", runs_unreadable)
            with pytest.raises(OSError, match="runs table"):
                run_job(spec, engine=ArrowEngine())
    kept = read_lease(Lake(lake_root), "crashjob")
    assert kept is not None and (kept.run_id, kept.inputs) == (killed_plan.run_id, killed_plan.inputs), kept
    write_jsonl(corpus / "part-9.jsonl", docs("new", 4))  # new input arrives before the next run
    run_job(spec, engine=ArrowEngine())
    ids = Lake(lake_root).read("samples").column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 15, f"{len(ids)} rows, {len(set(ids))} unique"


@pytest.mark.parametrize("failure", ["engine does not start", "runs table unreadable"])
def test_a_run_failing_before_it_has_a_plan_leaves_no_lease(tmp_path, monkeypatch, failure):
    """A run that fails before writing any plan (its engine does not start while it resumes a failed run, or reading
    the runs table fails) has nothing to complete: it deletes its lease. It left an expired lease without a plan,
    which `datahub runs` listed as an 'interrupted (killed?)' run and the next run reported taking over."""
    import datahub.pipeline.run as run_module
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.history import list_runs
    from tests.pipeline.corpus import job_raw, make_corpus

    lake_root = tmp_path / "lake"
    lease_path = lake_root / "_leases" / "crashjob.json"
    spec = validate_job_spec(job_raw(make_corpus(tmp_path / "corpus", files=2, per_file=5), lake_root))
    if failure == "engine does not start":
        real_execute = run_module.execute_graph

        def fails_after_the_graph(*args, **kwargs):
            real_execute(*args, **kwargs)
            raise RuntimeError("an operator failed")

        monkeypatch.setattr(run_module, "execute_graph", fails_after_the_graph)
        with pytest.raises(RuntimeError):
            run_job(spec, engine=ArrowEngine())
        monkeypatch.setattr(run_module, "execute_graph", real_execute)
        assert not lease_path.exists()  # a failed run with a runs row: resumed from that row, not from a lease

        class NoAnswer(ArrowEngine):
            def start(self) -> None:
                raise ConnectionError("ray cluster at ray://x:10001 did not answer")

        monkeypatch.setattr(run_module, "make_engine", lambda config: NoAnswer())
        with pytest.raises(ConnectionError):
            run_job(spec)  # no engine passed: run_job starts its own to resume the failed run
        expected = ["failed"]
    else:
        real_read = Lake.read

        def runs_unreadable(self, table, *args, **kwargs):
            if table == "runs":
                raise OSError("storage did not answer reading the runs table")
            return real_read(self, table, *args, **kwargs)

        monkeypatch.setattr(Lake, "read", runs_unreadable)
        with pytest.raises(OSError, match="runs table"):
            run_job(spec, engine=ArrowEngine())
        monkeypatch.setattr(Lake, "read", real_read)
        expected = []
    assert not lease_path.exists()
    assert [r["status"] for r in list_runs(Lake(lake_root))] == expected
