"""SparkFrame: the engine-neutral Frame on a Spark DataFrame (same semantics as RayFrame).

A frame is a Spark DataFrame plus a chain of pending batch functions. The DataFrame holds
either typed rows (``encoded=False``, after a join or groupBy) or Arrow IPC blobs
(``encoded=True``: file reads and batch-function output, whose schema is only known from
the data; see ``datahub.engines.spark.arrow``). Consecutive ``map_batches`` fuse into one
``mapInArrow``; the schema is discovered (one small Spark job over persisted blobs) only
when a join, groupBy, union or ``empty()`` needs typed columns.
"""

from __future__ import annotations

import pickle
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from datahub.engines.frame import Aggregate, BatchFn, Frame, R
from datahub.engines.sink import Sink, WriteTask
from datahub.engines.spark.arrow import IPC_DDL, ApplyChain, RowCounts, SchemasOf, decode, spark_name, spark_schema
from datahub.engines.spark.jobs import TaggedJobs, jobs_ended_on_exit
from datahub.engines.spark.parquet import WRITTEN_DDL, SinkPartition, WriteParquet
from datahub.engines.spark.quiet import map_in_arrow
from datahub.errors import TerminalError
from datahub.lake.files import ParquetTarget, conform, spark_compatible_schema, unify

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from datahub.lake.add_actions import DataFile

_JOIN_TYPES = {"inner": "inner", "left": "left", "left_anti": "left_anti"}


class SparkFrame(Frame):
    def __init__(
        self,
        session: SparkSession,
        df: DataFrame,
        *,
        schema: pa.Schema | None,
        encoded: bool,
        fns: tuple[BatchFn, ...] = (),
        name: str = "map",
        parents: tuple[SparkFrame, ...] = (),
        union_of: tuple[SparkFrame, ...] = (),
    ) -> None:
        if not encoded and schema is None:
            raise ValueError("a typed-rows SparkFrame needs its Arrow schema")
        self.session = session
        self.df = df
        self._schema = schema
        self.encoded = encoded
        self.fns = fns
        self.name = name
        self._parents = parents  # keeps persisted upstream data alive while this frame exists
        self._union_of = union_of  # df is the union of these frames' blobs: their schemas type it when empty
        self._known: tuple[DataFrame, pa.Schema] | None = None
        self._rows: DataFrame | None = None
        if encoded and not fns and schema is not None:
            self._known = (df, schema)

    # ---- internal forms -----------------------------------------------------------------

    @property
    def _is_rows(self) -> bool:
        return not self.encoded and not self.fns

    def _new(self, df: DataFrame, *, schema: pa.Schema | None, encoded: bool, parents: tuple[SparkFrame, ...] = ()) -> SparkFrame:
        return SparkFrame(self.session, df, schema=schema, encoded=encoded, parents=parents or (self,))

    def _encoded_df(self) -> DataFrame:
        """IPC blobs of this frame's rows (pending functions applied)."""
        if self._known is not None:
            return self._known[0]
        if self.encoded and not self.fns:
            return self.df
        chain = ApplyChain(self.fns, None if self.encoded else self._schema, node=self.name)
        return map_in_arrow(self.df, chain, IPC_DDL)

    def _discover(self) -> tuple[DataFrame, pa.Schema]:
        """Persist the blobs and unify the schemas of every batch: the exact schema of real rows."""
        if self._known is not None:
            return self._known
        blobs = _keep(self._encoded_df(), eager=False)  # computed by the schema job just below
        found = {row[0] for row in map_in_arrow(blobs, SchemasOf(), "schema binary").collect() if row[0] is not None}
        schemas = [pa.ipc.read_schema(pa.py_buffer(s)) for s in sorted(found)]
        if not schemas:  # no partitions at all: ask the functions about an empty input
            schemas = [self._empty_output_schema()]
        try:
            schema = unify(schemas)
            spark_schema(schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise TerminalError(
                f"graph node {self.name!r}: its batches have schemas that cannot be merged into one "
                f"({exc}); make the operator return the same column types for every batch. Schemas seen: "
                + "; ".join(str(s).replace("\n", ", ") for s in schemas)
            ) from exc
        self._known = (blobs, schema)
        return self._known

    def _empty_output_schema(self) -> pa.Schema:
        base = self._schema
        if base is None and self._union_of:  # an empty union (no duplicates found): its sides know their columns
            base = unify([side.schema for side in self._union_of])
        if base is None:  # blobs of unknown schema and no rows: nothing to ask
            return pa.schema([])
        table = base.empty_table()
        for fn in self.fns:
            table = fn(table)
        return table.schema

    def _rows_df(self) -> DataFrame:
        """Typed Spark rows (Spark-compatible column types) for joins, groupBys and unions."""
        if self._is_rows:
            return self.df
        if self._rows is None:
            blobs, schema = self._discover()
            self._rows = map_in_arrow(blobs, ApplyChain((), None, schema, node=self.name), spark_schema(schema))
        return self._rows

    @property
    def schema(self) -> pa.Schema:
        """The exact Arrow schema of this frame (runs schema discovery if still open)."""
        if self._is_rows:
            assert self._schema is not None
            return self._schema
        return self._discover()[1]

    # ---- Frame --------------------------------------------------------------------------

    def map_batches(self, fn: BatchFn, *, name: str = "map") -> SparkFrame:
        if self._known is not None and self.fns:  # start a new chain on the discovered blobs
            blobs, schema = self._known
            return SparkFrame(self.session, blobs, schema=schema, encoded=True, fns=(fn,), name=name, parents=(self,))
        return SparkFrame(self.session, self.df, schema=self._schema, encoded=self.encoded, fns=self.fns + (fn,), name=name,
                          parents=(self,), union_of=self._union_of)

    def groupby_agg(self, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]], *,
                    having: BatchFn | None = None) -> SparkFrame:
        from pyspark.sql import functions as F

        schema = self.schema
        rows = self._rows_df()
        fields = [schema.field(k) for k in keys]
        exprs = []
        for out, (column, kind) in aggregations.items():
            if kind == "count":  # rows per group, as Ray's Count()
                exprs.append(F.count(F.lit(1)).alias(spark_name(out)))
                fields.append(pa.field(out, pa.int64()))
                continue
            source = schema.field(column).type
            exprs.append(getattr(F, kind)(_col(column)).alias(spark_name(out)))
            if kind == "sum":
                source = pa.int64() if pa.types.is_integer(source) else pa.float64() if pa.types.is_floating(source) else source
            fields.append(pa.field(out, source))
        result = rows.groupBy(*[_col(k) for k in keys]).agg(*exprs)
        grouped = self._new(result, schema=pa.schema(fields), encoded=False)
        return grouped.map_batches(having, name="having") if having is not None else grouped

    def join(self, other: Frame, *, on: list[str], how: Literal["inner", "left", "left_anti"] = "inner") -> SparkFrame:
        if not isinstance(other, SparkFrame):
            raise TypeError(f"cannot join a SparkFrame with a {type(other).__name__}: both sides must come from the same engine")
        left, right = self.schema, other.schema
        missing = [k for k in on if k not in left.names or k not in right.names]
        if missing:
            raise TerminalError(f"join on {missing}: not a column of both sides (left: {left.names}, right: {right.names})")
        left_rest = [f for f in left if f.name not in on]
        right_rest = [f for f in right if f.name not in on]
        if how != "left_anti":
            clash = sorted({f.name for f in left_rest} & {f.name for f in right_rest})
            if clash:
                raise TerminalError(f"join on {on}: both sides have non-key columns {clash}; rename them on one side first")
        joined = self._rows_df().join(other._rows_df(), on=[spark_name(k) for k in on], how=_JOIN_TYPES[how])
        fields = [left.field(k) for k in on] + left_rest + ([] if how == "left_anti" else right_rest)
        joined = joined.select(*[_col(f.name) for f in fields])
        return self._new(joined, schema=pa.schema(fields), encoded=False, parents=(self, other))

    def union(self, other: Frame) -> SparkFrame:
        if not isinstance(other, SparkFrame):
            raise TypeError(f"cannot union a SparkFrame with a {type(other).__name__}: both sides must come from the same engine")
        if self._is_rows and other._is_rows:
            assert self._schema is not None and other._schema is not None
            if spark_compatible_schema(self._schema) == spark_compatible_schema(other._schema):
                schema = unify([self._schema, other._schema])
                return self._new(self.df.unionByName(other.df), schema=schema, encoded=False, parents=(self, other))
        # Blobs carry their own schemas: any two frames union; the schema is unified when needed.
        schema = None
        if self._known is not None and other._known is not None:
            schema = unify([self._known[1], other._known[1]])
        blobs = self._encoded_df().union(other._encoded_df())
        return SparkFrame(self.session, blobs, schema=schema, encoded=True, parents=(self, other), union_of=(self, other))

    def materialize(self) -> SparkFrame:
        if self._is_rows:
            return self._new(_keep(self.df, eager=True), schema=self._schema, encoded=False)
        if self._known is not None and not self.fns:
            return SparkFrame(self.session, _keep(self.df, eager=True), schema=self._known[1], encoded=True, name=self.name, parents=(self,))
        blobs, schema = self._discover()
        return SparkFrame(self.session, blobs, schema=schema, encoded=True, name=self.name, parents=(self,))

    def count(self) -> int:
        if self._is_rows:
            return int(self.df.count())
        from pyspark.sql import functions as F

        total = map_in_arrow(self._encoded_df(), RowCounts(), "rows long").agg(F.sum("rows")).collect()[0][0]
        return int(total or 0)

    def iter_batches(self) -> Generator[pa.Table, None, None]:
        """Stream to the driver one partition at a time (``toLocalIterator``), as Arrow tables."""
        target = self._schema if self._is_rows or self._known is not None else None
        if self._known is not None:
            target = self._known[1]
        from pyspark import StorageLevel

        blobs = self._encoded_df()
        cached_here = self._known is None and blobs.storageLevel == StorageLevel.NONE
        # a failed task (or a caller that stops reading): the jobs' other tasks end before this returns; only the
        # calls that start jobs are tagged (the caller's own jobs between two batches are not this pass's)
        jobs = TaggedJobs(self.session)
        if cached_here:
            # toLocalIterator computes one partition at a time; compute them all in parallel
            # first (spilling to executor disk), then stream the cached blobs to the driver.
            blobs = blobs.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with jobs.tagging():
                if cached_here:
                    blobs.count()
                rows = blobs.toLocalIterator(prefetchPartitions=True)  # its jobs run in a thread started here
            for row in rows:
                table = decode(row[0])
                if table.num_rows:
                    yield conform(table, target) if target is not None else table
        finally:
            jobs.end()
            if cached_here:
                _safe_unpersist(blobs)

    def empty(self) -> pa.Table:
        return self.schema.empty_table()

    # ---- executors write Parquet --------------------------------------------------------

    def write_parquet(
        self,
        directory: str,
        *,
        storage_options: dict[str, str] | None = None,
        prefix: str = "part",
        schema: pa.Schema | None = None,
    ) -> list[DataFile]:
        """Each partition writes one Parquet file under ``directory`` (local or s3://) on the executors.

        ``schema`` (default: ``delta_schema()``) is the file schema, e.g. the table's schema merged
        with this frame's. Returns the files (uri, size, rows, Delta stats) for
        ``datahub.lake.add_actions.commit_files``; only these small descriptions reach the driver.
        """
        from datahub.lake.add_actions import DataFile

        blobs, frame_schema = self._discover()
        target = ParquetTarget(directory.rstrip("/"), spark_compatible_schema(schema or frame_schema),
                               tuple(sorted((storage_options or {}).items())), prefix)
        with jobs_ended_on_exit(self.session):  # a failed task: no other one writes a file after the caller cleaned up
            rows = map_in_arrow(blobs, WriteParquet(target), WRITTEN_DDL).collect()
        return [DataFile(uri=r["uri"], size=int(r["size"]), rows=int(r["rows"]), stats=r["stats"]) for r in rows]

    def write(self, sink: Sink[R, Any]) -> list[R]:
        """One task per partition, given all of its batches (``datahub.engines.sink``)."""
        blobs, _ = self._discover()
        with jobs_ended_on_exit(self.session):  # a failed task: the others end before the sink's abort runs
            rows = map_in_arrow(blobs, SinkPartition(WriteTask(sink)), "result binary").collect()
        return [pickle.loads(row["result"]) for row in rows]

    def encoded_blobs(self) -> tuple[DataFrame, pa.Schema]:
        """This frame's rows as persisted Arrow IPC blobs (one ``ipc`` column) and their exact schema.

        For executor-side sinks (``datahub.engines.spark.sink``) that read every batch once.
        """
        return self._discover()

    def delta_schema(self) -> pa.Schema:
        """The Arrow schema ``write_parquet`` writes (Spark/Delta-compatible types)."""
        return spark_compatible_schema(self.schema)


def _col(name: str) -> Any:
    """A column by its literal name (names like ``_ev.normalize`` contain dots)."""
    from pyspark.sql import functions as F

    return F.col("`" + spark_name(name) + "`")


def _keep(df: DataFrame, *, eager: bool) -> DataFrame:
    """Keep ``df``'s data and cut its plan: iterative algorithms (connected components) would
    otherwise grow the plan every round until planning dominates or the JVM stack overflows.

    With a checkpoint dir (``spark.checkpoint.dir``) the copy is reliable (survives executor
    loss); otherwise it is a local checkpoint in the executors' block managers (memory, then disk).
    """
    from pyspark import StorageLevel

    if df.sparkSession.sparkContext.getCheckpointDir():
        return df.checkpoint(eager=eager)
    return df.localCheckpoint(eager=eager, storageLevel=StorageLevel.MEMORY_AND_DISK)


def _safe_unpersist(df: DataFrame) -> None:
    try:
        df.unpersist(blocking=False)
    except Exception:  # noqa: BLE001 - the session may already be gone
        pass
