"""A Ray Data execution that ends, failed or stopped early, leaves no task of it running.

On a failed task Ray Data's streaming executor shuts down with ``force=False``: it sends the other tasks Ray's graceful
cancel and forgets them. Ray 2.60's graceful cancel did not interrupt a task blocked in a call (974f5e0), so a failed
ingest read or ``map_batches`` stage left its other tasks running, writing or burning a CPU after the run had failed
(the executor's own ``force=True`` shutdown only runs when it is the first). ``StopTasksAtEnd``, set by ``RayEngine``
in the context of every dataset it creates (``stop_tasks_at_end``), records the executor's tasks at every scheduling
step and, once the execution has ended, cancels those still running and waits for them (``tasks.cancel_and_wait``: a
graceful cancel, then the worker is killed), in the thread that shuts the executor down, so before the error reaches
the caller.

It reads the executor's operators (``StreamingExecutor._topology``, ``PhysicalOperator.get_active_tasks``), which
are Ray Data internals: tests/engines/test_failed_passes.py fails if a Ray upgrade changes them.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.data._internal.execution.execution_callback import ExecutionCallback

from datahub.engines.ray.tasks import cancel_and_wait


def _task_ref(waitable: Any) -> Any:
    """The ref that is ready once the task has ended: a streaming generator's own return, not its next block."""
    return getattr(waitable, "_generator_ref", waitable)


class StopTasksAtEnd(ExecutionCallback):
    """Cancels and waits for the tasks a Ray Data execution still runs when it ends (one instance per execution)."""

    def __init__(self) -> None:
        self._running: list[Any] = []  # refs of the tasks active at the last step; replaced, never grown

    def on_execution_step(self, executor: Any) -> None:
        self._running = [_task_ref(task.get_waitable())
                         for op in (executor._topology or ())
                         for task in op.get_active_tasks()]

    def after_execution_succeeds(self, executor: Any) -> None:
        # also the end of an execution its consumer stopped early: Ray cancels its tasks gracefully then too
        self._stop()

    def after_execution_fails(self, executor: Any, error: Exception) -> None:
        self._stop()

    def _stop(self) -> None:
        running, self._running = self._running, []
        if running and ray.is_initialized():  # an executor collected after ray.shutdown has no tasks left
            cancel_and_wait(running)


def stop_tasks_at_end(dataset: Any) -> Any:
    """``dataset`` with ``StopTasksAtEnd`` in its own ``DataContext`` (the copy a dataset carries, which the datasets
    derived from it share), not in the process-wide one: a user's own Ray Data executions beside a RayEngine keep
    Ray's behaviour."""
    context = dataset.context
    if StopTasksAtEnd not in context.custom_execution_callback_classes:  # a new list: never the process-wide one's
        context.custom_execution_callback_classes = [*context.custom_execution_callback_classes, StopTasksAtEnd]
    return dataset
