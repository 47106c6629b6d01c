"""Arrow on Spark: type mapping, IPC blobs and the picklable functions run inside ``mapInArrow``.

Spark needs a ``mapInArrow`` output schema before it runs anything, but a batch operator's
output schema is only known from real rows (an operator sees no rows of an all-dropped or
empty batch, so such batches lack e.g. the ``quality`` struct). So a chain of batch
functions first writes each output batch as one Arrow IPC blob (a ``binary`` column; the
schema travels inside the blob), the driver unifies the schemas of all blobs, and a second
``mapInArrow`` decodes the blobs into typed columns, filling missing columns and struct
fields with nulls. Frames keep their exact Arrow schema; Spark carries a compatible one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from datahub.lake.files import conform, spark_compatible_schema, spark_compatible_type

BatchFn = Callable[[pa.Table], pa.Table]
IPC_COLUMN = "ipc"
IPC_DDL = f"{IPC_COLUMN} binary"
# Rows per IPC blob: a blob is one Spark row, so keep it far below Spark's 2 GiB value limit.
MAX_BLOB_ROWS = 4096


# ---- types ------------------------------------------------------------------------------


def spark_name(name: str) -> str:
    """A top-level column name Spark resolves literally (pyspark's mapInArrow trips over dots)."""
    return name.replace("%", "%25").replace(".", "%2E").replace("`", "%60")


def arrow_name(name: str) -> str:
    return name.replace("%60", "`").replace("%2E", ".").replace("%25", "%")


def spark_side_schema(schema: pa.Schema) -> pa.Schema:
    """What Spark carries: compatible types, escaped top-level names."""
    return pa.schema([pa.field(spark_name(f.name), spark_compatible_type(f.type)) for f in schema])


def spark_schema(schema: pa.Schema) -> Any:
    """The ``pyspark.sql.types.StructType`` for an Arrow schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(spark_side_schema(schema))


def from_spark_side(table: pa.Table) -> pa.Table:
    return table.rename_columns([arrow_name(c) for c in table.column_names])


# ---- IPC blobs --------------------------------------------------------------------------


def encode(table: pa.Table) -> list[bytes]:
    """One IPC stream per slice of at most MAX_BLOB_ROWS rows (one blob even for 0 rows: it carries the schema)."""
    blobs = []
    for start in range(0, max(table.num_rows, 1), MAX_BLOB_ROWS):
        part = table.slice(start, MAX_BLOB_ROWS)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part)
        blobs.append(sink.getvalue().to_pybytes())
    return blobs


def decode(blob: bytes | bytearray | memoryview) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def blob_schema(blob: bytes | bytearray | memoryview) -> pa.Schema:
    return pa.ipc.open_stream(pa.py_buffer(blob)).schema


def ipc_blobs(batch: pa.RecordBatch) -> Iterator[Any]:
    column = batch.column(IPC_COLUMN)
    for i in range(batch.num_rows):
        scalar = column[i]
        if scalar.is_valid:
            yield scalar.as_buffer()


def _ipc_batch(blobs: Sequence[bytes]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(blobs, pa.binary())], names=[IPC_COLUMN])


# ---- functions run by mapInArrow on the executors --------------------------------------


@dataclass(frozen=True)
class ApplyChain:
    """Input (typed rows of ``input_schema``, or IPC blobs when it is None) -> fns -> output.

    ``output_schema`` None: IPC blobs (schema still open); else typed Spark-compatible batches.
    """

    fns: tuple[BatchFn, ...]
    input_schema: pa.Schema | None
    output_schema: pa.Schema | None = None
    node: str = "map"

    def _tables(self, batch: pa.RecordBatch) -> Iterator[pa.Table]:
        if self.input_schema is None:
            for blob in ipc_blobs(batch):
                yield decode(blob)
        else:
            yield conform(from_spark_side(pa.Table.from_batches([batch])), self.input_schema)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        output = self.output_schema
        spark_output = spark_side_schema(output) if output is not None else None
        for batch in batches:
            for table in self._tables(batch):
                for fn in self.fns:
                    table = fn(table)
                if output is None or spark_output is None:
                    yield _ipc_batch(encode(table))
                elif table.num_rows:
                    try:
                        typed = conform(conform(table, output), spark_compatible_schema(output))
                        typed = typed.rename_columns(spark_output.names)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                        raise TypeError(
                            f"graph node {self.node!r}: a batch with schema {table.schema} does not fit the "
                            f"frame schema {self.output_schema}: {exc}"
                        ) from exc
                    yield from typed.to_batches()


@dataclass(frozen=True)
class SchemasOf:
    """IPC blobs -> the distinct serialized schemas of this partition."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        seen: dict[bytes, None] = {}
        for batch in batches:
            for blob in ipc_blobs(batch):
                seen.setdefault(blob_schema(blob).serialize().to_pybytes())
        yield pa.record_batch([pa.array(list(seen), pa.binary())], names=["schema"])


@dataclass(frozen=True)
class RowCounts:
    """IPC blobs -> one row count per blob (the blobs are not decoded beyond their batch headers)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            counts = [sum(b.num_rows for b in pa.ipc.open_stream(blob)) for blob in ipc_blobs(batch)]
            yield pa.record_batch([pa.array(counts, pa.int64())], names=["rows"])


@dataclass(frozen=True)
class ReadFiles:
    """An index of input files -> IPC blobs of the rows ``read`` yields for each file."""

    read: Callable[[Any], Iterator[pa.Table]]
    files: tuple[Any, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column("index").to_pylist():
                for table in self.read(self.files[index]):
                    yield _ipc_batch(encode(table))
