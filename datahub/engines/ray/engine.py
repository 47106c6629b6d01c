"""Ray Data engine: an embedded local Ray by default, ``engine.address`` for a cluster."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import pyarrow as pa

from datahub import settings
from datahub.engines.base import Engine, ReadFn
from datahub.engines.cluster import check_ray_address
from datahub.engines.cpus import usable_cpus
from datahub.engines.frame import Aggregate, BatchFn, Frame
from datahub.engines.ray import watchdog

if TYPE_CHECKING:
    import ray.data

    from datahub.config.spec import EngineSpec


# glibc malloc keeps freed memory of a process for reuse: its mmap threshold rises to the largest block
# freed (up to 32 MB), so later numpy and Ray buffers come from the heap, which is trimmed only from its
# top. A fixed 128 kB threshold (which also turns the rise off) and trim threshold return them to the
# system when freed: without it each worker of a 1M-document dedup held ~220 MB of freed heap at the end.
# Set in the environment of the job's workers (glibc reads it at exec); the driver is left as it is.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}

# A reducer of a hash shuffle holds its partition of every side twice (parts, then the concatenated
# table) plus its output: small partitions keep the workers' peak memory low on big inputs.
SHUFFLE_PARTITION_BYTES = 32 * 2**20
MAX_SHUFFLE_PARTITIONS = 256


class _EmptySchema:
    """The schema of a frame for which Ray computed no block.

    Ray calls no batch function on an empty block, and a dataset without blocks has no schema:
    a filter that keeps no row (no duplicates found) would lose its columns, and the next join
    or groupby would fail on them. This derives the schema by running the frame's function on an
    empty table of the nearest upstream schema that is known. Holds schemas and functions, no data.
    """

    def __init__(self, upstream: tuple[pa.Schema | _EmptySchema | None, ...], fn: BatchFn | None = None) -> None:
        self.upstream = upstream
        self.fn = fn

    def get(self) -> pa.Schema | None:
        for base in self.upstream:
            schema = base.get() if isinstance(base, _EmptySchema) else base
            if schema is not None:
                break
        else:
            return None
        if self.fn is None:
            return schema
        try:
            return self.fn(schema.empty_table()).schema
        except (pa.ArrowException, KeyError, IndexError, ValueError, TypeError):  # the function needs rows: unknown
            return None


def _reduced_schema(reduce: Any, *schemas: pa.Schema) -> _EmptySchema:
    """The schema of a shuffle's output, from its reducer run on empty inputs (cheap, on the driver)."""
    try:
        schema = reduce(*[s.empty_table() for s in schemas]).schema
    except (pa.ArrowException, KeyError, IndexError, ValueError, TypeError):
        schema = None
    return _EmptySchema((schema,))


class RayFrame(Frame):
    def __init__(self, dataset: ray.data.Dataset, *, schema: pa.Schema | None = None, parallelism: int = 2,
                 light: bool = False, empty_schema: _EmptySchema | None = None) -> None:
        self.dataset = dataset
        self._schema = schema
        self.parallelism = parallelism
        self._light = light
        self._empty_schema = empty_schema

    def light(self) -> RayFrame:
        return RayFrame(self.dataset, schema=self._schema, parallelism=self.parallelism, light=True,
                        empty_schema=self._empty_schema)

    def reusable(self) -> RayFrame:
        return self if self._light else self.materialize()

    def _wrap(self, dataset: ray.data.Dataset, schema: pa.Schema | None = None,
              empty_schema: _EmptySchema | None = None) -> RayFrame:
        return RayFrame(dataset, schema=schema, parallelism=self.parallelism, empty_schema=empty_schema)

    def _known_schema(self) -> pa.Schema | _EmptySchema | None:
        """This frame's schema if known without computing anything, else how to derive it when empty."""
        known = self._schema or getattr(self.dataset.schema(fetch_if_missing=False), "base_schema", None)
        return known if known is not None else self._empty_schema

    def _schema_of(self, dataset: ray.data.Dataset) -> pa.Schema:
        known = self._schema or getattr(dataset.schema(), "base_schema", None)
        if known is None and self._empty_schema is not None:
            known = self._empty_schema.get()
        return known or pa.schema([])

    def map_batches(self, fn: BatchFn, *, name: str = "map") -> RayFrame:
        dataset = self.dataset.map_batches(_NamedFn(fn, name), batch_format="pyarrow", batch_size=None, zero_copy_batch=True)
        return self._wrap(dataset, empty_schema=_EmptySchema((self._known_schema(),), fn))

    def _blocks(self) -> tuple[list[Any], pa.Schema, int]:
        """The frame computed into object-store blocks, with its schema and size in bytes."""
        dataset = self.dataset.materialize()
        return list(dataset.to_arrow_refs()), self._schema_of(dataset), int(dataset.size_bytes() or 0)

    def _partitions(self, *sides: tuple[list[Any], pa.Schema, int]) -> int:
        """Enough shuffle partitions that each reducer holds about ``SHUFFLE_PARTITION_BYTES``."""
        total = sum(size for _, _, size in sides)
        return max(self.parallelism, min(MAX_SHUFFLE_PARTITIONS, -(-total // SHUFFLE_PARTITION_BYTES)))

    def groupby_agg(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]], *,
                    having: BatchFn | None = None) -> RayFrame:
        import ray.data

        from datahub.engines.ray.execution import stop_tasks_at_end
        from datahub.engines.ray.shuffle import hash_shuffle

        side = self._blocks()
        reduce = _GroupBy(keys, aggregations, having)
        refs = hash_shuffle([side[:2]], [keys], self._partitions(side), reduce)
        dataset = ray.data.from_arrow_refs(cast(Any, refs))  # ray's stubs name another ObjectRef class
        return self._wrap(stop_tasks_at_end(dataset),
                          empty_schema=_reduced_schema(reduce, side[1]))

    def join(self, other: Frame, *, on: list[str], how: Literal["inner", "left", "left_anti"] = "inner") -> RayFrame:
        import ray.data

        from datahub.engines.ray.execution import stop_tasks_at_end
        from datahub.engines.ray.shuffle import hash_shuffle

        assert isinstance(other, RayFrame)
        left, right = self._blocks(), other._blocks()
        reduce = _Join(on, how)
        refs = hash_shuffle([left[:2], right[:2]], [on, on], self._partitions(left, right), reduce)
        dataset = ray.data.from_arrow_refs(cast(Any, refs))  # ray's stubs name another ObjectRef class
        return self._wrap(stop_tasks_at_end(dataset),
                          empty_schema=_reduced_schema(reduce, left[1], right[1]))

    def union(self, other: Frame) -> RayFrame:
        assert isinstance(other, RayFrame)
        return self._wrap(self.dataset.union(other.dataset), self._schema,
                          _EmptySchema((self._known_schema(), other._known_schema())))

    def materialize(self) -> RayFrame:
        return self._wrap(self.dataset.materialize(), self._schema, _EmptySchema((self._known_schema(),)))

    def count(self) -> int:
        return int(self.dataset.count())

    def iter_batches(self) -> Generator[pa.Table, None, None]:
        for batch in self.dataset.iter_batches(batch_format="pyarrow", batch_size=None, prefetch_batches=2):
            yield batch

    def empty(self) -> pa.Table:
        return self._schema_of(self.dataset).empty_table()


class _GroupBy:
    """Reducer: group one hash partition (all rows of each key are in it)."""

    def __init__(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]], having: BatchFn | None = None) -> None:
        self.keys = keys
        self.aggregations = aggregations
        self.having = having

    def __call__(self, table: pa.Table) -> pa.Table:
        from datahub.engines.kernels import aggregate_table

        groups = aggregate_table(table, self.keys, self.aggregations)
        return self.having(groups) if self.having is not None else groups


class _Join:
    """Reducer: join one co-partitioned pair."""

    def __init__(self, on: list[str], how: str) -> None:
        self.on = on
        self.how = how

    def __call__(self, left: pa.Table, right: pa.Table) -> pa.Table:
        from datahub.engines.kernels import join_tables

        return join_tables(left, right, self.on, self.how)


class _NamedFn:
    """A picklable wrapper so Ray names the stage after the graph node."""

    def __init__(self, fn: BatchFn, name: str) -> None:
        self.fn = fn
        self.__name__ = name

    def __call__(self, table: pa.Table) -> pa.Table:
        result = self.fn(table)
        pa.default_memory_pool().release_unused()  # a long-lived worker keeps Arrow's freed pages otherwise
        return result


class _ReadFiles:
    def __init__(self, read: ReadFn, files: Sequence[Any]) -> None:
        self.read = read
        self.files = files
        self.__name__ = "ingest"

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        for index in batch.column("index").to_pylist():
            yield from self.read(self.files[index])


class RayEngine(Engine):
    name = "ray"

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self._started_ray = False
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._data_configured = False  # by the first frame (``_data``): an export's plain tasks never import Ray Data

    def start(self) -> None:
        import ray

        if ray.is_initialized():  # a test session or a Ray Train script already owns Ray
            return
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "configure_logging": False,
            "ignore_reinit_error": True,
            "runtime_env": {"env_vars": dict(MALLOC_ENV)},
        }
        if self.spec.address:
            kwargs["address"] = self.spec.address
        else:
            kwargs["num_cpus"] = self.spec.num_cpus or settings.ray_num_cpus() or usable_cpus()
            if self.spec.object_store_mb is not None:
                kwargs["object_store_memory"] = self.spec.object_store_mb * 2**20
                # a capped store spills: one spill and one restore process (~100 MB each) instead of
                # Ray's default four of each
                kwargs["_system_config"] = {"max_io_workers": 1}
        kwargs.update(self.spec.conf)
        embedded = not self.spec.address and "address" not in kwargs
        if embedded:
            # Ray reads its auth mode only from the environment (system_config is refused) and warns when it is
            # unset. The embedded cluster is private to this process: "disabled" matches the mode Ray's config
            # cached at import when unset (so the driver and its workers agree even if ray was imported before
            # this line, which "token" would not). A mode the user set wins (export RAY_AUTH_MODE=token).
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        else:  # Ray retries an unreachable GCS for minutes, and a ray:// address without ray[client] is a traceback
            check_ray_address(str(kwargs["address"]))
        before = watchdog.children(os.getpid()) if embedded and watchdog.supported() else None
        ray.init(**kwargs)
        self._started_ray = True
        if before is not None:
            self._start_watchdog(watchdog.children(os.getpid()) - before)
        from ray.util.debug import log_once  # Ray Data's one-time warnings, marked as already shown

        log_once("ray_data_progress_manager_disabled")  # "Progress bars disabled": we turn them off on purpose
        if not self.spec.address:  # our own running tasks hold the CPUs we gave the embedded Ray
            log_once("cpu_warning")  # "the Ray cluster currently does not have any available CPUs"

    def _data(self) -> None:
        """Ray Data's settings for this engine's frames, once (importing ``ray.data`` costs ~0.6 s of start-up that
        commands running plain Ray tasks, such as an export, do not need)."""
        if self._data_configured:
            return
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # datahub draws its own progress
        ctx.print_on_execution_start = False
        # one INFO line per executed dataset (a dedup run executes dozens) drowns the run's own summary
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        self._data_configured = True

    def _start_watchdog(self, ray_processes: set[int]) -> None:
        """A child process that kills the embedded Ray's processes if this driver dies without ``stop``
        (kill -9, os._exit): Ray's agents and idle workers outlived such a driver by minutes."""
        # run as a script (its file): the stdlib only, no datahub or pyarrow import in this small process
        command = [sys.executable, watchdog.__file__, str(os.getpid()), *map(str, sorted(ray_processes))]
        self._watchdog = subprocess.Popen(command, stdin=subprocess.DEVNULL, close_fds=True)

    def stop(self) -> None:
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False
        if self._watchdog is not None:
            self._watchdog.terminate()
            self._watchdog.wait()
            self._watchdog = None

    @property
    def parallelism(self) -> int:
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def read_files(self, files: Sequence[Any], read: ReadFn) -> RayFrame:
        import ray.data

        from datahub.engines.ray.execution import stop_tasks_at_end

        self._data()
        index = stop_tasks_at_end(ray.data.from_items([{"index": i} for i in range(len(files))],
                                                      override_num_blocks=max(1, len(files))))
        dataset = index.map_batches(_ReadFiles(read, files), batch_format="pyarrow", batch_size=1)
        return RayFrame(dataset, parallelism=self.parallelism)

    def from_arrow(self, table: pa.Table) -> RayFrame:
        import ray.data

        from datahub.engines.ray.execution import stop_tasks_at_end

        self._data()
        dataset = stop_tasks_at_end(ray.data.from_arrow(table))
        return RayFrame(dataset, schema=table.schema, parallelism=self.parallelism)
