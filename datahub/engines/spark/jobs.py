"""Spark jobs that end with their caller: when the driver's block exits (a task failed, the driver was
interrupted, or a library such as Great Expectations caught a failed job's error and went on), the jobs it started
are cancelled and the block exits only once none of their tasks runs.

Spark fails a job as soon as one task fails, but the job's other tasks end later: their Python workers run on until
Spark's monitor kills them (it polls every 2 s, then waits ``spark.python.task.killTimeout``). A task left running
keeps writing after its caller cleaned up (the Ray passes had the same fault, fixed in 974f5e0).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

WAIT_S = 60.0  # bound on the wait for cancelled tasks (Spark kills a Python worker within a few seconds)


class TaggedJobs:
    """Jobs started under ``tagging()`` carry a job tag of their own; ``end()`` cancels those still running and
    returns once none of their tasks runs. Spark's tags are thread-local and inherited by the threads a job starts
    (``toLocalIterator``'s server): a generator tags only the calls that start its jobs, not the caller's code that
    runs between its yields."""

    def __init__(self, session: Any) -> None:
        self.context = session.sparkContext
        self.tag = f"datahub-{uuid.uuid4().hex[:16]}"

    @contextmanager
    def tagging(self) -> Iterator[None]:
        self.context.addJobTag(self.tag)
        try:
            yield
        finally:
            self.context.removeJobTag(self.tag)

    def end(self, wait_s: float = WAIT_S) -> None:
        if _running_tasks(self.context, self.tag):
            self.context.cancelJobsWithTag(self.tag)
            deadline = time.monotonic() + wait_s
            while _running_tasks(self.context, self.tag) and time.monotonic() < deadline:
                time.sleep(0.1)


@contextmanager
def jobs_ended_on_exit(session: Any, *, wait_s: float = WAIT_S) -> Iterator[None]:
    """Run the block's Spark jobs under a job tag of their own; on exit, cancel those still running (none after a
    block that got all its results) and wait until none of their tasks runs."""
    jobs = TaggedJobs(session)
    try:
        with jobs.tagging():
            yield
    finally:
        jobs.end(wait_s)


def _running_tasks(context: Any, tag: str) -> int:
    """Tasks still running in the stages of the jobs tagged ``tag`` (py4j: pyspark's tracker has no tag lookup)."""
    tracker = context._jsc.sc().statusTracker()
    running = 0
    for job in tracker.getJobIdsForTag(tag):
        info = tracker.getJobInfo(job)
        if info.isEmpty():
            continue
        for stage in info.get().stageIds():
            stage_info = tracker.getStageInfo(stage)
            if not stage_info.isEmpty():
                running += stage_info.get().numActiveTasks()
    return int(running)
