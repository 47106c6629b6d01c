"""Turn rows of a frozen samples table into WebDataset members: KEY.txt, KEY.json, KEY.<binary column>.

``text`` becomes ``.txt``; every binary column becomes a member named after the column;
all other columns (sample_id, source_uri, source_offset, meta, quality, ...) go into
``.json`` with sorted keys, so the bytes depend only on the row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import IntegrityError
from datahub.shards.tar import check_extension, check_key

TEXT_COLUMN = "text"
KEY_COLUMN = "sample_id"


def prepare(table: pa.Table, *, shuffle_seed: int | None, where: str) -> pa.Table:
    """Live rows without envelope columns, in export order: by sample_id, or a seeded permutation of that."""
    if KEY_COLUMN not in table.column_names:
        raise IntegrityError(f"{where}: no {KEY_COLUMN!r} column; only samples-like tables can be exported")
    if "_drop_reason" in table.column_names:
        table = table.filter(pc.is_null(table["_drop_reason"]))
    table = table.select([c for c in table.column_names if not c.startswith("_")])
    for column in table.column_names:
        if pa.types.is_binary(table.schema.field(column).type) or pa.types.is_large_binary(table.schema.field(column).type):
            check_extension(column, where=f"{where}: binary column {column!r}")
    ids = table[KEY_COLUMN]
    if ids.null_count:
        raise IntegrityError(f"{where}: {ids.null_count} rows have a null sample_id; fix the table before exporting")
    if pc.count_distinct(ids).as_py() != table.num_rows:
        raise IntegrityError(f"{where}: sample_id is not unique ({table.num_rows} rows, "
                             f"{pc.count_distinct(ids).as_py()} distinct ids): a shard key must name one sample; add exact "
                             "dedup to the job graph (or release a deduplicated table version) before exporting")
    bad = pc.invert(pc.match_substring_regex(ids, r"^[A-Za-z0-9_-]{1,90}$"))
    if pc.any(bad).as_py():
        check_key(pc.filter(ids, bad)[0].as_py(), where=where)
    order = pc.sort_indices(table, sort_keys=[(KEY_COLUMN, "ascending")])
    if shuffle_seed is not None:
        order = pa.array(np.asarray(order)[np.random.default_rng(shuffle_seed).permutation(len(order))])
    return table.take(order)


def binary_columns(schema: pa.Schema) -> list[str]:
    """Columns written as members of their own (named after the column)."""
    return [f.name for f in schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]


def export_columns(schema: pa.Schema, *, where: str) -> list[str]:
    """The columns an export writes (envelope columns ``_*`` are left out), checked for a key and member names."""
    if KEY_COLUMN not in schema.names:
        raise IntegrityError(f"{where}: no {KEY_COLUMN!r} column; only samples-like tables can be exported")
    for column in binary_columns(schema):
        if not column.startswith("_"):
            check_extension(column, where=f"{where}: binary column {column!r}")
    return [name for name in schema.names if not name.startswith("_")]


def json_records(batch: pa.RecordBatch | pa.Table, json_columns: list[str]) -> list[bytes]:
    """The ``.json`` member of every row: the row's other columns, keys sorted (one Python encode per row)."""
    cols = {c: batch.column(c).to_pylist() for c in json_columns}
    meta = cols.get("meta")
    if meta is not None:
        cols["meta"] = [_json_value("meta", v) for v in meta]
    return [_JSON.encode({c: cols[c][i] for c in json_columns}).encode("utf-8") for i in range(batch.num_rows)]


def encode(table: pa.Table, *, batch_rows: int = 4096) -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """(key, [(extension, bytes), ...]) per row, in table order."""
    binary = [c for c in table.column_names
              if pa.types.is_binary(table.schema.field(c).type) or pa.types.is_large_binary(table.schema.field(c).type)]
    json_columns = [c for c in table.column_names if c != TEXT_COLUMN and c not in binary]
    has_text = TEXT_COLUMN in table.column_names
    for batch in table.to_batches(max_chunksize=batch_rows):
        cols = {c: batch.column(c).to_pylist() for c in batch.column_names}
        for i in range(batch.num_rows):
            key = cols[KEY_COLUMN][i]
            record = {c: _json_value(c, cols[c][i]) for c in json_columns}
            members = [("txt", (cols[TEXT_COLUMN][i] or "").encode("utf-8") if has_text else b""),
                       ("json", json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                                           default=str).encode("utf-8"))]
            members.extend((c, cols[c][i]) for c in binary if cols[c][i] is not None)
            yield key, members


def _json_value(column: str, value: object) -> object:
    if column == "meta" and isinstance(value, str):  # meta is stored as a JSON string; export it as an object
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


# json.dumps with these options builds a new JSONEncoder per call; one shared encoder gives the same bytes.
_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def encode_tar(table: pa.Table, *, batch_rows: int = 4096) -> Iterator[pa.Array]:
    """Per batch of rows, a large_binary array whose value i is row i's tar members (header, data, padding).

    Byte-for-byte what ``member_bytes`` over :func:`encode` gives (tests compare them), but the
    framing and the text stay in Arrow: only the ``.json`` member is built per row in Python.
    """
    from datahub.shards.tar import member_blocks, zero_padding

    binary = binary_columns(table.schema)
    json_columns = [c for c in table.column_names if c != TEXT_COLUMN and c not in binary]
    empty = pa.scalar(b"", pa.large_binary())
    for batch in table.to_batches(max_chunksize=batch_rows):
        n = batch.num_rows
        keys = batch.column(KEY_COLUMN)
        if TEXT_COLUMN in batch.column_names:
            txt = pc.cast(pc.fill_null(batch.column(TEXT_COLUMN), ""), pa.large_binary())
        else:
            txt = pa.array([b""] * n, pa.large_binary())
        records = json_records(batch, json_columns)
        members: list[tuple[str, pa.Array]] = [("txt", txt), ("json", pa.array(records, pa.large_binary()))]
        members.extend((c, pc.cast(batch.column(c), pa.large_binary())) for c in binary)
        parts: list[pa.Array] = []
        for ext, data in members:
            present = pc.is_valid(data)
            sizes = np.asarray(pc.fill_null(pc.binary_length(data), 0), dtype=np.int64)
            names = pc.binary_join_element_wise(keys, pa.scalar(f".{ext}"), "")
            head, pad = member_blocks(names, sizes), zero_padding(sizes)
            if not pc.all(present).as_py():  # a null binary value writes no member
                head = pc.if_else(present, head, empty)
                pad = pc.if_else(present, pad, empty)
            parts.extend((head, pc.fill_null(data, empty), pad))
        yield pc.binary_join_element_wise(*parts, empty)
