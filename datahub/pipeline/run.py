"""Run a job: list inputs, build the graph on an engine, stream it to sinks, commit.

Crash safety: the run id is a pure function of the job, its new input files and the last
successful run, so a re-run after a crash gets the same id; each table's commit carries
that id as its Delta app transaction, so tables already committed are skipped and the
``runs`` row, committed last, marks the run done. A run that died without its ``runs`` row
is completed first, with its own id and input files, even when new files arrived since
(``datahub.pipeline.resume``); the new files then run as the next run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import traceback
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from datahub.config.spec import INGEST_NODE, JobSpec
from datahub.engines.base import Engine
from datahub.engines.frame import Frame
from datahub.engines.registry import make_engine
from datahub.errors import SpecError
from datahub.lake.lake import Lake
from datahub.lake.tables import LINEAGE, QUARANTINE, RUNS
from datahub.pipeline.openlineage import emit_run_event
from datahub.operator import BatchOperator, GlobalOperator, apply_batch_operator
from datahub.pipeline.context import ProgressFn, RunContext
from datahub.pipeline.faults import checkpoint
from datahub.pipeline.graph import Graph, build_graph
from datahub.pipeline.ingest import IngestFiles
from datahub.pipeline.inputs import InputListing, list_inputs
from datahub.pipeline.lease import JobLease
from datahub.pipeline.resume import PendingRun, committed_version, file_identity, pending_run, planned_files
from datahub.pipeline.sinks.samples import drain_samples
from datahub.pipeline.sinks.side_outputs import combined
from datahub.pipeline.sinks.stats import StatsSink
from operators.ingest.base import InputFile

_ANSI_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colour codes: never stored in runs.error

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_id: str
    job_name: str
    status: str  # succeeded | failed | skipped (nothing new) | already_committed
    lake: str
    inputs: list[str] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)
    table_versions: dict[str, int | None] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    error: str | None = None
    resumed: dict[str, Any] | None = None  # the interrupted run this invocation completed first
    notes: list[str] = field(default_factory=list)  # e.g. an input that matched no file (an emptied landing directory)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class QAGate(Protocol):
    """Runs a job's QA suites on the table version it committed and records the results
    (``datahub.qa.run_for_job``); returns the counts kept in the run record."""

    def __call__(self, lake: Lake, *, suites: Sequence[str] | None, table: str, version: int | None,
                 run_id: str) -> dict[str, Any]: ...


def previous_runs(lake: Lake, job_name: str) -> pa.Table:
    """Successful runs of ``job_name``, oldest first."""
    runs = lake.read("runs")
    if not runs.num_rows:
        return RUNS.empty_table()
    mask = pc.and_(pc.equal(runs.column("job_name"), job_name), pc.equal(runs.column("status"), "succeeded"))
    return runs.filter(mask).sort_by([("finished", "ascending")])


def list_job_inputs(spec: JobSpec, lake: Lake, *, source: str = "<spec>", history: pa.Table | None = None,
                    full: bool = False) -> InputListing:
    """The job's input files now. An input matching no file is an error, except when an earlier succeeded run of
    the job in ``lake`` read a file it matches: then it is listed in ``unmatched`` (an emptied landing directory: a
    run with nothing new; ``list_inputs``), unless the run is ``full``: a full run replaces the job's rows with
    those of the files listed now, so it would delete the samples of that input's earlier files."""
    def read_before() -> pa.Array | None:  # asked only when an input matched nothing: --check stays off the lake
        runs = history
        if runs is None:
            if not lake.exists("runs"):
                return None
            runs = lake.read("runs", columns=["inputs"], filters=(ds.field("job_name") == spec.name)
                             & (ds.field("status") == "succeeded"))
        if not runs.num_rows:
            return None
        return pc.struct_field(pc.list_flatten(runs.column("inputs")), "uri")

    listing = list_inputs(spec.inputs, source=source, read_before=read_before, job=spec.name)
    if full and listing.unmatched:
        raise SpecError(f"{source}: {listing.unmatched[0].removesuffix(' now')}; --full replaces the job's rows with "
                        "those of the files listed now, so the samples of that input's earlier files would be deleted; "
                        "restore the files or drop the input from the job")
    return listing


def ingested_identities(runs: pa.Table) -> set[tuple[str, int, str]]:
    seen: set[tuple[str, int, str]] = set()
    for inputs in runs.column("inputs").to_pylist() if runs.num_rows else []:
        for item in inputs or []:
            seen.add((item["uri"], item["size"], item["etag"] or item["mtime"]))
    return seen


def compute_run_id(spec: JobSpec, files: list[InputFile], last_run_id: str | None, full: bool) -> str:
    payload = json.dumps(
        {"job": spec.job_hash(), "files": [file_identity(f) for f in files], "after": last_run_id, "full": full},
        sort_keys=True,
    )
    return f"{spec.name}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"


def run_job(
    spec: JobSpec,
    *,
    full: bool = False,
    engine: Engine | None = None,
    progress: ProgressFn | None = None,
    source: str = "<spec>",
    qa_gate: QAGate | None = None,
) -> RunResult:
    """Run ``spec`` once, incrementally (only new input files) unless ``full``.

    Holds the job's lease on the lake for the whole run (a second run of the same job is
    refused with ``RunLockedError``). ``full`` reprocesses every input file and replaces this
    job's rows in the samples and quarantine tables in one commit each (``mode="overwrite"``
    with a predicate on the job's run ids; other jobs' rows stay, Delta keeps the old version
    for time travel); lineage is an event log and is appended to.

    If an earlier run of the job died without recording success (killed, or failed after
    committing some tables), that run is completed first with its own id and input files,
    then the new files run as the next run; the result is the new run's (its ``resumed``
    field holds the completed one's), or the completed run's when nothing new follows.

    A spec with a ``qa:`` section needs ``qa_gate`` (``datahub.qa.run_for_job``; the ``datahub run``
    command passes it): the gate runs after the table commits and before the run's row, never failing the run.
    """
    graph = build_graph(spec, source=source)  # before any work: unknown operators, bad params, cycles
    if spec.qa is not None and qa_gate is None:
        raise SpecError(f"{source}: qa: this job runs QA suites after its commit; pass "
                        "run_job(spec, qa_gate=datahub.qa.run_for_job) (the `datahub run` command does), "
                        "or remove the qa: section")
    lake = Lake(spec.lake.root, storage_options=spec.lake.storage_options)
    with JobLease(lake, spec.name, source=_job_spec_path(source), full=full) as lease:
        # A lease without a plan (none carried over from a killed holder) has nothing to complete: a failure before
        # _run_leased writes one (the runs table unreadable, the engine not starting) must not leave it behind.
        lease.keep_on_failure = lease.info.inputs is not None
        pending = pending_run(lake.read("runs"), spec.name, lease.took_over)
        if lease.took_over is not None and lease.took_over.left_by_failed_run:  # the lease said what it took over
            if pending is None:
                log.warning("nothing to resume: job %r has no unfinished run", spec.name)
            else:
                log.warning("resuming run %s (%s) first", pending.run_id, pending.origin)
        if pending is None:
            return _run_leased(spec, graph, lease=lease, full=full, engine=engine, progress=progress, source=source,
                               qa_gate=qa_gate)
        own_engine = engine is None
        engine = engine or make_engine(spec.engine)
        if own_engine:
            engine.start()
        try:
            resumed = _run_leased(spec, graph, lease=lease, full=pending.full, engine=engine, progress=progress,
                                  source=source, pending=pending, qa_gate=qa_gate)
            result = _run_leased(spec, graph, lease=lease, full=full, engine=engine, progress=progress, source=source,
                                 qa_gate=qa_gate)
        finally:
            if own_engine:
                engine.stop()
    if resumed.status == "skipped":  # dropped: it committed nothing and its input changed
        return result
    if result.status == "skipped":
        return resumed
    result.resumed = resumed.as_dict()
    return result


def _job_spec_path(source: str) -> str:
    """The spec file as an absolute path (the resume hint must work from any directory)."""
    return source if source.startswith("<") else os.path.abspath(source)


def _run_leased(spec: JobSpec, graph: Graph, *, lease: JobLease, full: bool, engine: Engine | None, progress: ProgressFn | None,
                source: str, pending: PendingRun | None = None, qa_gate: QAGate | None = None) -> RunResult:
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    # Until its first commit a new run has nothing to complete, so a failure frees the lease. A run completing a
    # killed one whose plan only the lease held (no runs row) keeps it there on failure: that run may have committed.
    lease.keep_on_failure = pending is not None and not pending.recorded
    lake = Lake(spec.lake.root, storage_options=spec.lake.storage_options)
    history = previous_runs(lake, spec.name)
    listing = list_job_inputs(spec, lake, source=source, history=history, full=full)
    all_files = listing.files
    if pending is not None:  # complete an interrupted run: its id, its files
        planned = planned_files(pending, all_files, lake, source=source, job_hash=spec.job_hash())
        run_id, files = pending.run_id, planned or []
    else:
        if full:
            files = all_files
        else:
            done = ingested_identities(history)
            files = [f for f in all_files if file_identity(f) not in done]
        last_run_id = history.column("run_id")[-1].as_py() if history.num_rows else None
        run_id = compute_run_id(spec, files, last_run_id, full)
    # The plan goes into the lease before anything is committed: a run that takes over this
    # lease after a SIGKILL completes exactly this run.
    lease.update(run_id=run_id, inputs=[list(file_identity(f)) for f in files], run_full=full, job_hash=spec.job_hash())
    result = RunResult(run_id, spec.name, "succeeded", lake.root, inputs=[f.uri for f in files],
                       notes=list(listing.unmatched))
    if not files:
        result.status = "skipped"
        return result
    if lake.applied("runs", run_id):
        result.status = "already_committed"
        return result
    lineage_outputs = [lake.table_uri(t) for t in ("samples", "quarantine", "lineage", "runs")]
    emit_run_event(spec, "START", run_id=run_id, inputs=result.inputs, outputs=lineage_outputs)

    own_engine = engine is None
    engine = engine or make_engine(spec.engine)
    staging = tempfile.mkdtemp(prefix=f"datahub-{run_id}-")
    try:
        if own_engine:
            engine.start()
        context = RunContext(run_id=run_id, spec=spec, lake=lake, engine=engine, full=full, progress=progress)
        sinks = execute_graph(graph, files, context, staging)
        checkpoint("after_graph")
        lease.ensure_held()
        lease.keep_on_failure = True  # from here a failure may leave commits behind: the lease keeps the plan
        context.report("commit", 0)
        replace = _job_rows_predicate(spec.name) if full else None
        samples_sinks = [s for s in sinks.values() if isinstance(s, tuple)]
        versions: dict[str, int | None] = {}
        for table_name, sink in samples_sinks:
            versions[table_name] = _commit_staged(lake, table_name, sink.samples, run_id, spec, None,
                                                  replace=replace and replace.format(column="ingest_run_id"))
            checkpoint(f"after_commit:{table_name}")
            result.counts = sink.counts.as_dict()
            versions["quarantine"] = _commit_staged(lake, "quarantine", sink.quarantine, run_id, spec, QUARANTINE,
                                                    replace=replace and replace.format(column="run_id"))
            checkpoint("after_commit:quarantine")
            versions["lineage"] = _commit_staged(lake, "lineage", sink.lineage, run_id, spec, LINEAGE)
            checkpoint("after_commit:lineage")
        for table_name, parts in context.side_outputs.items():
            versions[table_name] = combined(parts).commit(lake, table_name, txn=run_id,
                                                          metadata={"datahub.run_id": run_id, "datahub.job": spec.name})
            if versions[table_name] is None and lake.applied(table_name, run_id):  # committed before a crash
                versions[table_name] = committed_version(lake, table_name, run_id)
            checkpoint(f"after_commit:{table_name}")
        result.stats = {name: s.as_dict() for name, s in sinks.items() if isinstance(s, StatsSink)}
        result.counts["context"] = context.counters
        if spec.qa is not None and qa_gate is not None and spec.qa.table in versions:  # recorded in qa_results
            result.counts["qa"] = qa_gate(lake, suites=spec.qa.suites, table=spec.qa.table,
                                              version=versions[spec.qa.table], run_id=run_id)
        result.table_versions = versions
        result.duration_s = round(time.perf_counter() - t0, 3)
        checkpoint("before_commit:runs")
        lease.ensure_held()
        _commit_run_row(lake, spec, graph, result, files, engine.name, started, txn=run_id, full=full,
                        job_spec=_job_spec_path(source))
        checkpoint("after_commit:runs")
        emit_run_event(spec, "COMPLETE", run_id=run_id, inputs=result.inputs,
                       outputs=[lake.table_uri(t) for t in [*result.table_versions, "runs"]])
        return result
    except Exception as exc:
        result.status = "failed"
        result.error = _ANSI_CODES.sub("", f"{type(exc).__name__}: {exc}")  # Ray colours its task errors
        result.duration_s = round(time.perf_counter() - t0, 3)
        try:  # record the failure; its own txn, so the successful re-run can still commit
            _commit_run_row(lake, spec, graph, result, files, engine.name, started,
                            txn=f"{run_id}/failed/{int(time.time() * 1000)}",
                            detail=_ANSI_CODES.sub("", traceback.format_exc(limit=5)),
                            full=full, job_spec=_job_spec_path(source))
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
        emit_run_event(spec, "FAIL", run_id=run_id, inputs=result.inputs, outputs=lineage_outputs, error=result.error)
        raise
    finally:
        if own_engine:
            engine.stop()
        shutil.rmtree(staging, ignore_errors=True)


def execute_graph(graph: Graph, files: list[InputFile], context: RunContext, staging: str) -> dict[str, Any]:
    """Build the frames node by node and drain every sink; returns the sinks by node name."""
    spec = context.spec
    reader = IngestFiles(
        run_id=context.run_id,
        max_record_bytes=spec.limits.max_record_bytes,
        min_text_chars=spec.limits.min_text_chars,
        batch_rows=spec.limits.batch_rows,
        kinds=spec.input_kinds(),
    )
    frames: dict[str, Frame] = {INGEST_NODE: context.engine.read_files(files, reader)}
    fan_out: dict[str, int] = {INGEST_NODE: sum(INGEST_NODE in n.upstream for n in graph.nodes.values())}
    fan_out.update({name: len(node.downstream) for name, node in graph.nodes.items()})
    node_ops = {n.name: (n.operator.op_id, n.operator.params_hash) for n in graph.operators() if n.operator is not None}
    sinks: dict[str, Any] = {}
    if fan_out[INGEST_NODE] > 1:
        frames[INGEST_NODE] = frames[INGEST_NODE].materialize()
    waiting = dict(fan_out)  # consumers not built yet: a frame all consumers hold is dropped here, so its
    for name in graph.order:  # blocks are freed as soon as the engine no longer needs them
        node = graph.nodes[name]
        frame = frames[node.upstream[0]]
        for other in node.upstream[1:]:
            frame = frame.union(frames[other])
        for upstream in node.upstream:
            waiting[upstream] -= 1
            if not waiting[upstream]:
                del frames[upstream]
        if isinstance(node.operator, BatchOperator):
            frame = frame.map_batches(partial(apply_batch_operator, node.operator, node=name), name=name)
        elif isinstance(node.operator, GlobalOperator):
            pending = [frame]  # handed over whole: the operator may free its input once it has read it
            del frame
            context.report(f"{name} ({node.operator.name})", 0)  # a phase in the progress: dedup runs here
            frame = node.operator.apply(pending.pop(), context)
        elif node.sink == "samples":
            # one samples sink per graph (graph.py): Spark executors write the tables' files
            sink = drain_samples(frame, context, f"{staging}/{name}", node_ops, table=node.table or "samples")
            sinks[name] = (node.table or "samples", sink)
            continue
        elif node.sink == "stats":
            stats = StatsSink()
            with closing(frame.iter_batches()) as batches:  # a failure stops the engine's reads (Frame.iter_batches)
                stats.consume(batches)
            sinks[name] = stats
            continue
        if fan_out.get(name, 0) > 1:
            frame = frame.materialize()
        checkpoint(f"after_node:{name}")
        frames[name] = frame
    return sinks


def _job_rows_predicate(job: str) -> str:
    """SQL matching rows written by runs of ``job`` (run ids are ``{job}-{12 hex}``), for --full."""
    return "{column} LIKE '" + job.replace("'", "''").replace("_", "\\_") + "-" + "_" * 12 + "'"


def _commit_staged(lake: Lake, table: str, staged: Any, run_id: str, spec: JobSpec, schema: pa.Schema | None,
                   *, replace: str | None = None) -> int | None:
    version = staged.commit(lake, table, txn=run_id, metadata={"datahub.run_id": run_id, "datahub.job": spec.name},
                            empty_schema=schema, replace=replace)  # Lake.commit, or add actions for executor files
    if version is None and lake.applied(table, run_id):  # committed before a crash: record that version
        return committed_version(lake, table, run_id)
    return version


def _commit_run_row(lake: Lake, spec: JobSpec, graph: Graph, result: RunResult, files: list[InputFile],
                    engine: str, started: datetime, *, txn: str, full: bool, job_spec: str,
                    detail: str | None = None) -> None:
    row = {
        "run_id": result.run_id,
        "job_name": spec.name,
        "job_hash": spec.job_hash(),
        "engine": engine,
        "status": result.status,
        "started": started,
        "finished": datetime.now(timezone.utc),
        "operators": graph.operator_ids(),
        "inputs": [{"uri": f.uri, "size": f.size, "etag": f.etag, "mtime": f.mtime} for f in files],
        "counts": json.dumps({**result.counts, "stats": result.stats, "duration_s": result.duration_s}, default=str),
        "table_versions": json.dumps(result.table_versions),
        "error": None if result.error is None else (result.error + ("\n" + detail if detail else "")),
        "job_spec": None if job_spec.startswith("<") else job_spec,
        "full": full,
    }
    lake.commit("runs", pa.Table.from_pylist([row], RUNS), txn=txn, metadata={"datahub.run_id": result.run_id})
