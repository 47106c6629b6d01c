"""Ray Data engine: an embedded local Ray by default, ``engine.address`` for a cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

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

    def groupby_agg(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]]) -> RayFrame:
        from ray.data.aggregate import Count, Max, Min, Sum

        kinds = {"min": Min, "max": Max, "sum": Sum}
        aggs = []
        for out, (column, kind) in aggregations.items():
            if kind == "count":
                aggs.append(Count(alias_name=out))
            else:
                aggs.append(kinds[kind](column, alias_name=out))
        # num_partitions: Ray's default hash shuffle has 200 partitions, each a task; on small
        # frames (every label-propagation round of dedup) that costs seconds per groupby.
        grouped = self.dataset.groupby(keys if len(keys) > 1 else keys[0], num_partitions=self.parallelism)
        return self._wrap(grouped.aggregate(*aggs))

    def join(self, other: Frame, *, on: list[str], how: Literal["inner", "left", "left_anti"] = "inner") -> RayFrame:
        assert isinstance(other, RayFrame)
        join_type = {"inner": "inner", "left": "left_outer", "left_anti": "left_anti"}[how]
        return self._wrap(self.dataset.join(other.dataset, join_type=join_type, num_partitions=self.parallelism, on=tuple(on)))

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
        kwargs.update(self.spec.conf)
        ray.init(**kwargs)
        self._started_ray = True
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # datahub draws its own progress
        ctx.print_on_execution_start = False

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
