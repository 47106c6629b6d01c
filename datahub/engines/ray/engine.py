"""Ray Data engine: an embedded local Ray by default, ``engine.address`` for a cluster."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, cast

import pyarrow as pa

from datahub.engines.base import Engine, ReadFn
from datahub.engines.frame import Aggregate, BatchFn, Frame

if TYPE_CHECKING:
    import ray.data

    from datahub.config.spec import EngineSpec
    from operators.ingest.base import InputFile


class RayFrame(Frame):
    def __init__(self, dataset: ray.data.Dataset, *, schema: pa.Schema | None = None, parallelism: int = 2) -> None:
        self.dataset = dataset
        self._schema = schema
        self.parallelism = parallelism

    def _wrap(self, dataset: ray.data.Dataset, schema: pa.Schema | None = None) -> RayFrame:
        return RayFrame(dataset, schema=schema, parallelism=self.parallelism)

    def map_batches(self, fn: BatchFn, *, name: str = "map") -> RayFrame:
        return self._wrap(self.dataset.map_batches(_NamedFn(fn, name), batch_format="pyarrow", batch_size=None, zero_copy_batch=True))

    def _blocks(self) -> tuple[list[Any], pa.Schema]:
        """The frame computed into object-store blocks, with its schema."""
        refs = self.dataset.to_arrow_refs()
        schema = self.empty().schema
        return list(refs), schema

    def groupby_agg(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]]) -> RayFrame:
        import ray.data

        from datahub.engines.ray.shuffle import hash_shuffle

        refs = hash_shuffle([self._blocks()], [keys], self.parallelism, _GroupBy(keys, aggregations))
        return self._wrap(ray.data.from_arrow_refs(cast(Any, refs)))  # ray's stubs name another ObjectRef class

    def join(self, other: Frame, *, on: list[str], how: Literal["inner", "left", "left_anti"] = "inner") -> RayFrame:
        import ray.data

        from datahub.engines.ray.shuffle import hash_shuffle

        assert isinstance(other, RayFrame)
        refs = hash_shuffle([self._blocks(), other._blocks()], [on, on], self.parallelism, _Join(on, how))
        return self._wrap(ray.data.from_arrow_refs(cast(Any, refs)))  # ray's stubs name another ObjectRef class

    def union(self, other: Frame) -> RayFrame:
        assert isinstance(other, RayFrame)
        return self._wrap(self.dataset.union(other.dataset), self._schema)

    def materialize(self) -> RayFrame:
        return self._wrap(self.dataset.materialize(), self._schema)

    def count(self) -> int:
        return int(self.dataset.count())

    def iter_batches(self) -> Iterator[pa.Table]:
        for batch in self.dataset.iter_batches(batch_format="pyarrow", batch_size=None, prefetch_batches=2):
            yield batch

    def empty(self) -> pa.Table:
        schema = self._schema
        if schema is None:
            ray_schema = self.dataset.schema()
            schema = getattr(ray_schema, "base_schema", None) if ray_schema is not None else None
        return (schema or pa.schema([])).empty_table()


class _GroupBy:
    """Reducer: group one hash partition (all rows of each key are in it)."""

    def __init__(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]]) -> None:
        self.keys = keys
        self.aggregations = aggregations

    def __call__(self, table: pa.Table) -> pa.Table:
        from datahub.engines.kernels import aggregate_table

        return aggregate_table(table, self.keys, self.aggregations)


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
        return self.fn(table)


class _ReadFiles:
    def __init__(self, read: ReadFn, files: list[InputFile]) -> None:
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

    def start(self) -> None:
        import ray

        if ray.is_initialized():  # a test session or a Ray Train script already owns Ray
            return
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "configure_logging": False,
            "ignore_reinit_error": True,
        }
        if self.spec.address:
            kwargs["address"] = self.spec.address
        else:
            kwargs["num_cpus"] = self.spec.num_cpus or os.cpu_count() or 1
            if self.spec.object_store_mb is not None:
                kwargs["object_store_memory"] = self.spec.object_store_mb * 2**20
        kwargs.update(self.spec.conf)
        ray.init(**kwargs)
        self._started_ray = True
        from ray.util.debug import log_once  # Ray Data's one-time warnings, marked as already shown

        log_once("ray_data_progress_manager_disabled")  # "Progress bars disabled": we turn them off on purpose
        if not self.spec.address:  # our own running tasks hold the CPUs we gave the embedded Ray
            log_once("cpu_warning")  # "the Ray cluster currently does not have any available CPUs"
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # datahub draws its own progress
        ctx.print_on_execution_start = False
        # one INFO line per executed dataset (a dedup run executes dozens) drowns the run's own summary
        logging.getLogger("ray.data").setLevel(logging.WARNING)

    def stop(self) -> None:
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    @property
    def parallelism(self) -> int:
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def read_files(self, files: list[InputFile], read: ReadFn) -> RayFrame:
        import ray.data

        index = ray.data.from_items([{"index": i} for i in range(len(files))], override_num_blocks=max(1, len(files)))
        dataset = index.map_batches(_ReadFiles(read, files), batch_format="pyarrow", batch_size=1)
        return RayFrame(dataset, parallelism=self.parallelism)

    def from_arrow(self, table: pa.Table) -> RayFrame:
        import ray.data

        return RayFrame(ray.data.from_arrow(table), schema=table.schema, parallelism=self.parallelism)
