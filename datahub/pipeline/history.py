"""The history of a lake's runs: what ``datahub runs`` shows, as a function notebooks and tests call."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from datahub.lake.lake import Lake
from datahub.pipeline.lease import list_leases, rerun_command


def list_runs(lake: Lake, *, job: str | None = None) -> list[dict[str, Any]]:
    """Runs recorded in the lake's ``runs`` table plus runs seen only through their lease.

    status: succeeded | failed (its error and a resume hint) | running (lease held) |
    interrupted (a lease left by a killed run: no ``runs`` row, holder gone or expired).
    A failed row whose run id later succeeded is marked ``resumed``.
    """
    table = lake.read("runs")
    rows = table.to_pylist() if table.num_rows else []
    succeeded = {r["run_id"] for r in rows if r["status"] == "succeeded"}
    recorded = {r["run_id"] for r in rows}
    out: list[dict[str, Any]] = []
    for r in rows:
        if job and r["job_name"] != job:
            continue
        counts = json.loads(r["counts"] or "{}")
        item = {
            "run_id": r["run_id"], "job": r["job_name"], "status": r["status"], "engine": r["engine"],
            "started": r["started"], "finished": r["finished"],
            "duration_s": counts.get("duration_s") or _seconds(r["started"], r["finished"]),
            "inputs": len(r["inputs"] or []),
            "records_read": counts.get("records_read", 0), "samples_written": counts.get("samples_written", 0),
            "dropped": counts.get("dropped_total", 0), "quarantined": counts.get("quarantined_total", 0),
            "error": r["error"], "hint": None,
        }
        if r["status"] == "failed":
            if r["run_id"] in succeeded:
                item["status"] = "failed (resumed)"
            else:  # job_spec and full are null in lakes written before they were recorded
                # lake.ref: the lake YAML the lake was opened from, if any, so the pasted command has its storage options
                command = rerun_command(r["job_name"], job_spec=r.get("job_spec"), lake=lake.ref, full=bool(r.get("full")))
                item["hint"] = f"fix the error above, then re-run (it completes this run first): {command}"
        out.append(item)
    for lease in list_leases(lake):
        if job and lease.job != job:
            continue
        if lease.run_id in succeeded and lease.is_stale():
            continue  # killed after its runs row: nothing to resume (a live holder carries that plan until it writes
            # its own, run_job's first lease.update: it is listed, as running)
        if lease.run_id in recorded and lease.is_stale():
            continue  # a failed run left its plan behind: its runs row above already says how to resume
        stale = lease.is_stale()
        out.append({
            "run_id": lease.run_id, "job": lease.job, "status": "interrupted" if stale else "running", "engine": None,
            "started": datetime.fromtimestamp(lease.acquired, timezone.utc), "finished": None,
            "duration_s": None if stale else round(datetime.now(timezone.utc).timestamp() - lease.acquired, 1),
            "inputs": None, "records_read": None, "samples_written": None, "dropped": None, "quarantined": None,
            "error": "the run stopped without recording a result (killed?)" if stale else None,
            # lake.ref, as for a failed run: the lake YAML runs was given keeps its storage options in the command
            "hint": (f"interrupted, re-run with: {lease.rerun_command(lake.ref)}" if stale
                     else f"lease {lease.describe()}"),
        })
    out.sort(key=lambda item: item["started"] or datetime.min.replace(tzinfo=timezone.utc))
    return out


def _seconds(started: datetime | None, finished: datetime | None) -> float | None:
    return round((finished - started).total_seconds(), 3) if started and finished else None
