"""Finish a job's interrupted run before starting a new one (crash safety when new input arrives).

A run id is a function of the job, its input files and the last successful run. A run that
died after committing some tables (SIGKILL, or an exception) must be finished under *its*
run id with *its* input files: a new run over old + new files would get another id, ingest
the dead run's files a second time (duplicate rows) and leave the dead run's commits behind
as orphans (and its ``minhash_index`` rows would make its own samples look like duplicates).

Where the dead run's plan comes from:
- killed (no ``finally`` ran): the lease it left behind, taken over by this run
  (``JobLease.took_over``), which records the run id, ``--full`` and the input identities
  before the run commits anything;
- raised: its ``failed`` row in ``runs`` (same fields), newer than the job's last success.

``run_job`` completes that run first (same run id, same files: tables it committed are
skipped by their app transaction), then runs whatever is new as the next run, so the lake
ends as uninterrupted runs would have left it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from datahub.errors import LakeError

if TYPE_CHECKING:
    from datahub.lake.lake import Lake
    from datahub.pipeline.lease import LeaseInfo
    from operators.ingest.base import InputFile

log = logging.getLogger(__name__)

Identity = tuple[str, int, str]  # uri, size, etag (or mtime where the store has no etag)


def file_identity(file: InputFile) -> Identity:
    return (file.uri, file.size, file.etag or file.mtime)


@dataclass(frozen=True)
class PendingRun:
    """A run of the job that started but never recorded success: what to complete first."""

    run_id: str
    inputs: tuple[Identity, ...]
    full: bool
    origin: str  # how we know of it, for messages
    job_hash: str | None = None  # the spec it ran (None: recorded before datahub kept it)
    recorded: bool = False  # its plan is in a runs row (a failed run), not only in the lease it left


def pending_run(runs: pa.Table, job: str, took_over: LeaseInfo | None) -> PendingRun | None:
    """The run of ``job`` to complete before a new one, from the lease this run took over or
    the ``runs`` table (all rows, any job); None when the job's last run finished."""
    rows = [r for r in (runs.to_pylist() if runs.num_rows else []) if r["job_name"] == job]
    succeeded = {r["run_id"] for r in rows if r["status"] == "succeeded"}
    if took_over is not None and took_over.run_id and took_over.inputs is not None and took_over.run_id not in succeeded:
        full = took_over.full if took_over.run_full is None else took_over.run_full
        return PendingRun(took_over.run_id, tuple((str(u), int(s), str(e)) for u, s, e in took_over.inputs),
                          full, f"interrupted run (lease left by {took_over.host} pid {took_over.pid})",
                          took_over.job_hash)
    last_success = max((r["finished"] for r in rows if r["status"] == "succeeded"), default=None)
    failed = [r for r in rows if r["status"] == "failed" and r["run_id"] not in succeeded
              and (last_success is None or r["finished"] > last_success)]
    if not failed:
        return None
    row = max(failed, key=lambda r: r["finished"])
    inputs = tuple((i["uri"], int(i["size"]), i["etag"] or i["mtime"]) for i in row["inputs"] or [])
    return PendingRun(row["run_id"], inputs, bool(row.get("full")), "failed run (its runs row)", row.get("job_hash"),
                      recorded=True)


def planned_files(pending: PendingRun, listed: list[InputFile], lake: Lake, *, source: str,
                  job_hash: str) -> list[InputFile] | None:
    """The input files of ``pending`` as listed now, or None when the run can be dropped.

    A planned file that is gone or changed cannot be read as the dead run read it, and an edited
    job spec would not compute what the dead run computed. If the dead run committed nothing,
    nothing is lost by dropping it (the new run ingests what is there with the spec as it is);
    otherwise completing it would mix two versions of the input or of the graph, so stop and say why.
    """
    if pending.job_hash is not None and pending.job_hash != job_hash:
        committed = committed_tables(lake, pending.run_id)
        if not committed:
            log.warning("%s: dropping %s %s: the job spec changed since and it committed nothing", source,
                        pending.origin, pending.run_id)
            return None
        raise LakeError(
            f"{source}: run {pending.run_id} ({pending.origin}) committed {', '.join(committed)} in {lake.root} "
            f"but did not finish, and the job spec changed since (job hash {pending.job_hash} -> {job_hash}). "
            "Completing it with the edited spec would mix outputs of two graphs: restore the spec it started with "
            "and re-run the job to complete it, then apply the edit."
        )
    by_identity = {file_identity(f): f for f in listed}
    missing = [identity for identity in pending.inputs if identity not in by_identity]
    if not missing:
        return [by_identity[identity] for identity in pending.inputs]
    committed = committed_tables(lake, pending.run_id)
    uri, size, tag = missing[0]
    now = next((f for f in listed if f.uri == uri), None)
    what = "is gone" if now is None else f"changed (size {size} -> {now.size}, etag/mtime {tag!r} -> {now.etag or now.mtime!r})"
    if not committed:
        log.warning("%s: dropping %s %s: input %s %s and it committed nothing", source, pending.origin, pending.run_id,
                    uri, what)
        return None
    raise LakeError(
        f"{source}: run {pending.run_id} ({pending.origin}) committed {', '.join(committed)} in {lake.root} "
        f"but did not finish, and its input {uri} {what} since"
        + (f" (and {len(missing) - 1} more input files)" if len(missing) > 1 else "")
        + ". It must be completed with the input it started on: restore that file as it was and re-run the job."
    )


def committed_tables(lake: Lake, run_id: str) -> list[str]:
    """Lake tables holding a commit with app transaction ``run_id``."""
    return [name for name in lake.tables() if lake.applied(name, run_id)]


def committed_version(lake: Lake, table: str, txn: str) -> int | None:
    """The table version right after the commit tagged ``txn`` (None if there is none).

    Skips the table-property commits that directly follow (``Lake.commit`` sets properties
    right after creating a table), so a resumed run records the version a clean run records.
    """
    if not lake.exists(table):
        return None
    history: list[dict[str, Any]] = sorted(lake.history(table), key=lambda h: h["version"])
    for position, entry in enumerate(history):
        if entry.get("datahub.txn") == txn:
            version = int(entry["version"])
            for later in history[position + 1:]:
                if later.get("operation") != "SET TBLPROPERTIES":
                    break
                version = int(later["version"])
            return version
    return None
