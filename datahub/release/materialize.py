"""Rows streamed into a lake table in bounded memory: Parquet files written here, committed as add actions.

``Lake.commit`` hands a stream to delta-rs's writer, which buffers a row group and up to a whole target-size file
per open file; here each batch goes straight into a Parquet row group of ``row_group_rows`` and a new file starts
every ``file_bytes``, so what is held is one row group whatever the stream's length. The files are committed in one
Delta commit with the app transaction ``txn`` (``datahub.lake.add_actions.commit_files``): a re-run is a no-op,
and a failure removes what was written (uncommitted files are invisible to readers anyway).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from datahub.lake.add_actions import DataFile, commit_files
from datahub.lake.files import ParquetFile, ParquetTarget, data_file, file_prefix, file_schema, remove_files
from datahub.lake.lake import Lake

ROW_GROUP_ROWS = 2048  # of whole sample rows: 2,048 texts of 5 KB are a 10 MB row group
FILE_BYTES = 128 * 2**20  # uncompressed bytes written to one file before the next starts


def commit_rows(lake: Lake, name: str, batches: Iterable[pa.Table], *, schema: pa.Schema, txn: str,
                metadata: Mapping[str, Any] | None = None, row_group_rows: int = ROW_GROUP_ROWS,
                file_bytes: int = FILE_BYTES) -> int | None:
    """Append ``batches`` (tables of ``schema``) to table ``name`` as one commit tagged ``txn``; the new version,
    or None when ``txn`` was committed before (the batches are then not read). An empty stream still creates the
    table (with ``schema``)."""
    if lake.applied(name, txn):
        return None
    target = ParquetTarget(lake.table_uri(name), file_schema(lake, name, schema),
                           tuple(sorted(lake.storage_options.items())), file_prefix(txn), row_group_rows)
    files: list[DataFile] = []
    current: ParquetFile | None = None
    written = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if current is None:
                current, written = target.open(), 0
            current.write(batch)
            written += batch.nbytes
            if written >= file_bytes:
                files.extend(_closed(current))
                current = None
        if current is not None:
            files.extend(_closed(current))
            current = None
        if not files:
            return lake.commit(name, target.schema.empty_table(), txn=txn, schema=target.schema, metadata=metadata)
        return commit_files(lake, name, files, schema=target.schema, txn=txn, metadata=metadata)
    except BaseException:
        if current is not None:
            current.abort()
        remove_files(target, [f.uri for f in files])
        raise


def _closed(file: ParquetFile) -> list[DataFile]:
    description = file.close()
    return [data_file(description)] if description is not None else []
