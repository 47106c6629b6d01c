"""Spark engine: an embedded ``local[2]`` by default; ``engine.master`` for a cluster.

Batch operators run unchanged inside ``mapInArrow``; global operators run as Spark
groupBy/join through ``SparkFrame``. A run's tables (samples, quarantine, lineage and the
dedup indexes) are written by the executors as Parquet files in the tables' folders and
committed by the driver as Delta add actions with the run's app transaction
(``datahub.engines.spark.sink``, ``datahub.lake.add_actions``): no rows stream to the driver,
no Spark jars beyond pyspark's own, no Maven, no delta-spark. Only ``--full`` runs, whose
replacement of a job's rows is a delta-rs predicate overwrite, stream the samples to the driver.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from datahub.engines.base import Engine, ReadFn
from datahub.engines.frame import Frame
from datahub.engines.sink import SplitFn, SplitWritten
from datahub.engines.spark.arrow import IPC_DDL, ReadFiles, encode
from datahub.engines.spark.frame import SparkFrame
from datahub.engines.spark.quiet import map_in_arrow
from datahub.engines.spark.sink import write_split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from datahub.config.spec import EngineSpec
    from datahub.lake.lake import Lake


class SparkEngine(Engine):
    name = "spark"

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self._session: SparkSession | None = None
        self._owns_session = False

    def start(self) -> None:
        if self._session is not None:
            return
        from pyspark.sql import SparkSession

        from datahub.engines.spark.session import build_session, configure_context, session_conf

        active = SparkSession.getActiveSession()
        if active is not None:  # a test session or a spark-submit script already owns Spark
            import os
            import sys

            configure_context(active, session_conf(self.spec, python=sys.executable, environ=os.environ))
            self._session = active
            return
        self._session = build_session(self.spec)
        self._owns_session = True

    def stop(self) -> None:
        if self._session is not None and self._owns_session:
            self._session.stop()
        self._session = None
        self._owns_session = False

    @property
    def session(self) -> SparkSession:
        if self._session is None:
            raise RuntimeError("SparkEngine is not started; use `with engine:` or call engine.start()")
        return self._session

    @property
    def parallelism(self) -> int:
        return max(1, int(self.session.sparkContext.defaultParallelism))

    def read_files(self, files: Sequence[Any], read: ReadFn) -> SparkFrame:
        """One Spark task per input file; rows leave the task as Arrow IPC blobs."""
        n = max(1, len(files))
        index = self.session.sparkContext.parallelize([(i,) for i in range(len(files))], numSlices=n)
        df = map_in_arrow(self.session.createDataFrame(index, "index long"), ReadFiles(read, tuple(files)), IPC_DDL)
        return SparkFrame(self.session, df, schema=None, encoded=True, name="ingest")

    def from_arrow(self, table: pa.Table) -> SparkFrame:
        rows_per_part = max(1, math.ceil(table.num_rows / self.parallelism))
        blobs = [blob for start in range(0, max(table.num_rows, 1), rows_per_part) for blob in encode(table.slice(start, rows_per_part))]
        df = self.session.createDataFrame([(blob,) for blob in blobs], IPC_DDL)
        return SparkFrame(self.session, df, schema=table.schema, encoded=True, name="from_arrow")

    def write_split(self, frame: Frame, split: SplitFn, lake: Lake, *, run_id: str, table: str,
                    samples_schema: Callable[[pa.Schema], pa.Schema]) -> SplitWritten:
        """Executors split and write the tables' files (``datahub.engines.spark.sink``)."""
        return write_split(frame, split, lake, run_id=run_id, table=table, samples_schema=samples_schema)
