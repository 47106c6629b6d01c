"""Turn rows of a frozen samples table into WebDataset members: KEY.txt, KEY.json, KEY.<binary column>.

``text`` becomes ``.txt``; every binary column becomes a member named after the column;
all other columns (sample_id, source_uri, source_offset, meta, quality, ...) go into
``.json`` with sorted keys, so the bytes depend only on the row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import IntegrityError
from datahub.kinds import KindSpec, kind_spec, registered_kinds
from datahub.shards.tar import check_extension, check_key

_orjson: ModuleType | None
try:  # the fast .json encoder (a dependency); without it the standard library writes the same bytes, slower
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised by the fallback test through monkeypatch
    _orjson = None

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
    """Columns written as members of their own (named after the column); a sample kind's media columns are
    written by the kind instead (``kind_members``)."""
    taken = {c for spec in _member_kinds(schema) for c in spec.member_columns}
    return [f.name for f in schema
            if (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)) and f.name not in taken]


def _member_kinds(schema: pa.Schema) -> list[KindSpec]:
    """The registered kinds that write members of their own and whose member columns this schema has (image_text:
    the ``image`` column as ``.jpg``/``.png``/``.webp`` by format)."""
    return [spec for spec in map(kind_spec, registered_kinds())
            if spec.members is not None and spec.member_columns
            and all(c in schema.names for c in spec.member_columns)]


def kind_members(batch: pa.RecordBatch | pa.Table) -> list[tuple[str, pa.Array]]:
    """(extension, bytes per row; null: no member) of the kinds' media members, the same extensions for every
    batch of one schema."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    out: list[tuple[str, pa.Array]] = []
    for spec in _member_kinds(table.schema):
        assert spec.members is not None
        for extension, values in spec.members(table).items():
            check_extension(extension, where=f"sample kind {spec.name}")
            values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
            out.append((extension, pc.cast(values, pa.large_binary())))
    return out


def export_columns(schema: pa.Schema, *, where: str) -> list[str]:
    """The columns an export writes (envelope columns ``_*`` are left out), checked for a key and member names."""
    if KEY_COLUMN not in schema.names:
        raise IntegrityError(f"{where}: no {KEY_COLUMN!r} column; only samples-like tables can be exported")
    for column in binary_columns(schema):
        if not column.startswith("_"):
            check_extension(column, where=f"{where}: binary column {column!r}")
    return [name for name in schema.names if not name.startswith("_")]


def json_records(batch: pa.RecordBatch | pa.Table, json_columns: list[str]) -> pa.LargeBinaryArray:
    """The ``.json`` member of every row (large_binary): the row's other columns, keys sorted, as the standard
    library's ``json`` writes them (``_JSON``, the reference: ``_python_records``), built column by column
    (``_columnar_records``)."""
    if len(set(json_columns)) != len(json_columns):  # a row's dict keeps one of equal keys: the reference decides
        return pa.array(_python_records(batch, json_columns), pa.large_binary())
    return _columnar_records(batch, json_columns)


def _columnar_records(batch: pa.RecordBatch | pa.Table, json_columns: list[str]) -> pa.LargeBinaryArray:
    """``_python_records`` built column by column: every value's JSON text (strings quoted and integers and
    booleans cast in Arrow, a float column as one orjson list cut at its commas, structs joined from their fields),
    then one element-wise join with the keys, in sorted order. Values those cannot write alike (strings to escape,
    floats outside plain decimals, meta, lists, other types) are encoded one by one, by orjson where it gives the
    same bytes, else by ``_JSON``. About 2.5 us a row on the benchmark's rows against 6-8 us row by row."""
    empty = pa.scalar(b"", pa.large_binary())
    if not json_columns:
        return pa.array([b"{}"] * batch.num_rows, pa.large_binary())
    parts: list[pa.Array | pa.Scalar] = []
    for position, column in enumerate(sorted(json_columns)):
        values = batch.column(column)
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        lead = ("{" if position == 0 else ",") + _JSON.encode(column) + ":"
        parts.extend((pa.scalar(lead.encode("utf-8"), pa.large_binary()), _json_texts(values, meta=column == "meta")))
    parts.append(pa.scalar(b"}", pa.large_binary()))
    return pc.binary_join_element_wise(*parts, empty)


def _json_texts(values: pa.Array, *, meta: bool = False) -> pa.Array:
    """The JSON text of every value of one column (large_binary, no nulls), as ``_JSON`` writes the value that
    ``to_pylist`` gives (``meta``: a JSON string parsed first, as ``_json_value`` does)."""
    kind = values.type
    if meta:  # whatever its Arrow type (string, large_string, string_view, dictionary, ...): parsed value by value
        return _one_by_one(values, meta=True)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = values.cast(pa.large_binary())
        quote = pa.scalar(b'"', pa.large_binary())
        texts = pc.binary_join_element_wise(quote, text, quote, pa.scalar(b"", pa.large_binary()))
        # json escapes '"', '\\' and control characters; strings without them are written as they are (one search
        # over the column's bytes, row by row only when it finds one)
        if _search_bytes(text, _ESCAPED):
            escaped = np.asarray(pc.fill_null(pc.match_substring_regex(text, _ESCAPED), False))
            texts = _replace(texts, escaped, lambda rows: _one_by_one(values.take(pa.array(rows)), meta=False))
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        texts = values.cast(pa.large_string()).cast(pa.large_binary())
    elif (pa.types.is_float32(kind) or pa.types.is_float64(kind)) and _orjson is not None and not _has_nonfinite(values):
        texts = _float_texts(values)
    elif pa.types.is_struct(kind) and kind.num_fields and len(set(_field_names(kind))) == kind.num_fields:
        names = sorted(range(kind.num_fields), key=lambda i: kind.field(i).name)
        parts: list[pa.Array | pa.Scalar] = []
        for position, i in enumerate(names):
            lead = ("{" if position == 0 else ",") + _JSON.encode(kind.field(i).name) + ":"
            parts.extend((pa.scalar(lead.encode("utf-8"), pa.large_binary()), _json_texts(values.field(i))))
        parts.append(pa.scalar(b"}", pa.large_binary()))
        texts = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))
        if values.null_count:
            texts = pc.if_else(pc.is_valid(values), texts, pa.scalar(b"null", pa.large_binary()))
        return texts
    elif pa.types.is_null(kind):
        return pa.array([b"null"] * len(values), pa.large_binary())
    else:  # lists, empty structs, temporal, decimal, binary...: value by value
        return _one_by_one(values, meta=False)
    return pc.fill_null(texts, pa.scalar(b"null", pa.large_binary())) if values.null_count else texts


def _field_names(kind: pa.StructType) -> list[str]:
    return [kind.field(i).name for i in range(kind.num_fields)]


def _replace(texts: pa.Array, rows: np.ndarray, encode: Callable[[np.ndarray], pa.Array]) -> pa.Array:
    """``texts`` with the rows where ``rows`` is True replaced by ``encode(their indices)``."""
    if not rows.any():
        return texts
    return pc.replace_with_mask(texts, pa.array(rows), encode(np.flatnonzero(rows)))


def _float_texts(values: pa.Array) -> pa.Array:
    """Finite floats (nulls allowed) as ``_JSON`` writes them: one orjson list of the column cut at its commas
    (a number or null holds none); the values orjson may write otherwise than ``json`` (an exponent, 0.0000...: see
    ``_RISKY_VALUE``) are encoded again one by one."""
    assert _orjson is not None
    body = _orjson.dumps(values.to_pylist())
    data = np.frombuffer(body, dtype=np.uint8)[1:-1]  # without the brackets
    commas = np.flatnonzero(data == ord(","))
    if not len(values) or len(commas) != len(values) - 1:
        return _one_by_one(values, meta=False)
    offsets = np.empty(len(values) + 1, dtype=np.int64)
    offsets[0] = 0
    offsets[1:-1] = commas + 1 - np.arange(1, len(values))  # a value's start once the commas before it are gone
    offsets[-1] = len(data) - len(commas)
    packed = data[data != ord(",")]
    texts = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(values),
                                             [None, pa.py_buffer(offsets), pa.py_buffer(packed)])
    # only numbers and null: an "e" is an exponent; "0.0000" also finds 10.00001 (encoded again, the same bytes)
    risky = [at for needle in (b"e", b"0.0000") for at in _occurrences(body, needle)]
    if not risky:
        return texts
    rows = np.zeros(len(values), dtype=bool)
    rows[np.searchsorted(commas + 1, np.asarray(risky), side="right")] = True  # the value each match (body offset) is in
    return _replace(texts, rows, lambda picked: _one_by_one(values.take(pa.array(picked)), meta=False))


def _occurrences(data: bytes, needle: bytes) -> Iterator[int]:
    """Where ``needle`` starts in ``data`` (bytes.find: a memory scan, fast when it is rare)."""
    at = data.find(needle)
    while at >= 0:
        yield at
        at = data.find(needle, at + 1)


def _search_bytes(values: pa.Array, pattern: str) -> bool:
    """Whether ``pattern`` occurs in the bytes of a binary column, searched as one value (one scan, not one per row:
    a pattern that cannot span two values, as one character class)."""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset:values.offset + len(values) + 1]
    if not len(values) or values.buffers()[2] is None or offsets[-1] == offsets[0]:
        return False
    whole = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 1, [None, pa.py_buffer(offsets[[0, -1]].copy()),
                                                                    values.buffers()[2]])
    return bool(pc.match_substring_regex(whole, pattern)[0].as_py())


def _risky(joined: bytes) -> bool:
    """Whether any of the JSON texts joined by newlines holds a number orjson may write otherwise than ``json``
    (one RE2 scan)."""
    return bool(pc.match_substring_regex(pa.array([joined], pa.large_binary()), _RISKY_JOINED)[0].as_py())


def _one_by_one(values: pa.Array, *, meta: bool) -> pa.Array:
    """Values encoded one at a time (large_binary): by orjson where its bytes are ``_JSON``'s (plain types, no
    number it may format otherwise: ``_RISKY_VALUE``), else by ``_JSON``.

    orjson and ``json`` agree on strings (checked over every code point), integers, key order and floats in
    [1e-4, 1e16), where both write the shortest repr in plain decimals; outside it ``json`` writes 1e-05 and
    1e+16, orjson 0.00001 and 1e16."""
    items = values.to_pylist()
    if meta:
        items = [_json_value("meta", item) for item in items] if _orjson is None else items
    reference = _JSON.encode
    if _orjson is None or not (meta or (_plain_type(values.type) and not _has_nonfinite(values))):
        return pa.array([reference(item).encode("utf-8") for item in items], pa.large_binary())
    loads, dumps, decode_error, options = _orjson.loads, _orjson.dumps, _orjson.JSONDecodeError, _orjson.OPT_SORT_KEYS

    def exact(item: Any) -> bytes:
        return reference(_json_value("meta", item) if meta else item).encode("utf-8")

    def one(item: Any) -> bytes:
        try:
            return dumps(loads(item) if meta and isinstance(item, str) else item, option=options)
        except (decode_error, TypeError):  # not strict JSON (NaN, 1e400, not JSON), an integer past 64 bits
            return exact(item)

    try:  # one comprehension for the common case, value by value only when one is refused
        if meta:
            out = [dumps(None if item is None else loads(item), option=options) for item in items]
        else:
            out = [dumps(item, option=options) for item in items]
    except (decode_error, TypeError):
        out = [one(item) for item in items]
    if not _risky(b"\n".join(out)):
        return pa.array(out, pa.large_binary())
    texts = pa.array(out, pa.large_binary())
    risky = np.asarray(pc.match_substring_regex(texts, _RISKY_VALUE))
    fixed = [exact(items[i]) for i in np.flatnonzero(risky).tolist()]
    return pc.replace_with_mask(texts, pa.array(risky), pa.array(fixed, pa.large_binary()))


def _python_records(batch: pa.RecordBatch | pa.Table, json_columns: list[str]) -> list[bytes]:
    """The reference encoding: one ``json`` encode per row (meta, a JSON string, parsed into an object)."""
    cols = {c: batch.column(c).to_pylist() for c in json_columns}
    meta = cols.get("meta")
    if meta is not None:
        cols["meta"] = [_json_value("meta", v) for v in meta]
    return [_JSON.encode({c: cols[c][i] for c in json_columns}).encode("utf-8") for i in range(batch.num_rows)]


def _plain_type(kind: pa.DataType) -> bool:
    if (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)
            or pa.types.is_boolean(kind) or pa.types.is_null(kind) or pa.types.is_floating(kind)):
        return not pa.types.is_float16(kind)  # half floats come back as numpy scalars
    if pa.types.is_struct(kind):
        return all(_plain_type(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _plain_type(kind.value_type)
    return False


def _has_nonfinite(values: pa.Array | pa.ChunkedArray) -> bool:
    """Any NaN or infinity among the float values under ``values`` (child arrays whole: a false alarm only
    costs the slower encoder)."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    for chunk in chunks:
        kind = chunk.type
        if pa.types.is_floating(kind):
            if len(chunk) and pc.any(pc.invert(pc.is_finite(chunk))).as_py():
                return True
        elif pa.types.is_struct(kind):
            if any(_has_nonfinite(chunk.field(i)) for i in range(kind.num_fields)):
                return True
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            if _has_nonfinite(chunk.values):
                return True
    return False


def encode(table: pa.Table, *, batch_rows: int = 4096) -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """(key, [(extension, bytes), ...]) per row, in table order."""
    binary = binary_columns(table.schema)
    media = {c for spec in _member_kinds(table.schema) for c in spec.member_columns}
    json_columns = [c for c in table.column_names if c != TEXT_COLUMN and c not in binary and c not in media]
    has_text = TEXT_COLUMN in table.column_names
    for batch in table.to_batches(max_chunksize=batch_rows):
        cols = {c: batch.column(c).to_pylist() for c in batch.column_names}
        kind_cols = [(ext, values.to_pylist()) for ext, values in kind_members(batch)]
        for i in range(batch.num_rows):
            key = cols[KEY_COLUMN][i]
            record = {c: _json_value(c, cols[c][i]) for c in json_columns}
            members = [("txt", (cols[TEXT_COLUMN][i] or "").encode("utf-8") if has_text else b""),
                       ("json", json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                                           default=str).encode("utf-8"))]
            members.extend((ext, values[i]) for ext, values in kind_cols if values[i] is not None)
            members.extend((c, cols[c][i]) for c in binary if cols[c][i] is not None)
            yield key, members


def _json_value(column: str, value: object) -> object:
    if column == "meta" and isinstance(value, str):  # meta is stored as a JSON string; export it as an object
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


# A number token written with an exponent or as 0.0000...: where orjson and ``json`` may format a float differently
# (``json`` writes 1e-05 and 1e+16, orjson 0.00001 and 1e16; an integer of meta past 64 bits comes out of
# orjson.loads as a float, >= 1e16). Only tokens at the start of a value or after ``:``, ``,`` or ``[`` count, so the
# hex digits of a sample id ("3e9f...") inside a string do not send values back.
_RISKY_VALUE = r"(?:^|[:,\[])-?[0-9][0-9.]*[eE]|(?:^|[:,\[])-?0\.0000"  # in one value's text
_RISKY_JOINED = r"(?:^|[:,\[\n])-?[0-9][0-9.]*[eE]|(?:^|[:,\[\n])-?0\.0000"  # in values joined by newlines
_ESCAPED = r'[\x00-\x1f"\\]'  # what json escapes in a string (ensure_ascii=False)

# json.dumps with these options builds a new JSONEncoder per call; one shared encoder gives the same bytes.
_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def encode_tar(table: pa.Table, *, batch_rows: int = 4096) -> Iterator[pa.Array]:
    """Per batch of rows, a large_binary array whose value i is row i's tar members (header, data, padding).

    Byte-for-byte what ``member_bytes`` over :func:`encode` gives (tests compare them), but the
    framing and the text stay in Arrow: only the ``.json`` member is built per row in Python.
    """
    for rows, _ in _encode_tar(table, batch_rows=batch_rows):
        yield rows


def _encode_tar(table: pa.Table, *, batch_rows: int) -> Iterator[tuple[pa.Array, list[tuple[str, np.ndarray]]]]:
    """``encode_tar``'s rows with, per member kind in row order, its extension and the data bytes of each row's
    member (-1 where the row has none)."""
    from datahub.shards.tar import member_blocks, zero_padding

    columns = _member_columns(table.schema)
    empty = pa.scalar(b"", pa.large_binary())
    for batch in table.to_batches(max_chunksize=batch_rows):
        keys = batch.column(KEY_COLUMN)
        parts: list[pa.Array] = []
        layout: list[tuple[str, np.ndarray]] = []
        for ext, data in _members(batch, *columns):
            present = pc.is_valid(data)
            sizes = np.asarray(pc.fill_null(pc.binary_length(data), 0), dtype=np.int64)
            names = pc.binary_join_element_wise(keys, pa.scalar(f".{ext}"), "")
            head, pad = member_blocks(names, sizes), zero_padding(sizes)
            if not pc.all(present).as_py():  # a null binary value writes no member
                head = pc.if_else(present, head, empty)
                pad = pc.if_else(present, pad, empty)
                layout.append((ext, np.where(np.asarray(present), sizes, -1)))
            else:
                layout.append((ext, sizes))
            parts.extend((head, pc.fill_null(data, empty), pad))
        yield pc.binary_join_element_wise(*parts, empty), layout


def _member_columns(schema: pa.Schema) -> tuple[list[str], list[str]]:
    """The columns written as members of their own (binary columns) and those that make the ``.json`` member."""
    binary = binary_columns(schema)
    media = {c for spec in _member_kinds(schema) for c in spec.member_columns}
    return binary, [c for c in schema.names if c != TEXT_COLUMN and c not in binary and c not in media]


def _members(batch: pa.RecordBatch, binary: list[str], json_columns: list[str]) -> list[tuple[str, pa.Array]]:
    """A batch's members in row order, (extension, data per row; null: no member): ``.txt``, ``.json``, the kinds'
    media members, the binary columns."""
    n = batch.num_rows
    if TEXT_COLUMN in batch.column_names:
        txt = pc.cast(pc.fill_null(batch.column(TEXT_COLUMN), ""), pa.large_binary())
    else:
        txt = pa.array([b""] * n, pa.large_binary())
    members: list[tuple[str, pa.Array]] = [("txt", txt), ("json", json_records(batch, json_columns))]
    members.extend(kind_members(batch))
    members.extend((c, pc.cast(batch.column(c), pa.large_binary())) for c in binary)
    return members


def member_data(batch: pa.RecordBatch | pa.Table) -> tuple[list[pa.LargeBinaryArray], tuple[str, ...], np.ndarray]:
    """Every row's member data without tar headers or padding, one large_binary array per member kind in row order
    (``.txt`` from the batch's text buffer as it is; a null value: no member), the members' extensions (the same for
    every batch of one schema) and their data bytes per row (rows x extensions, int64; -1 where a row has no such
    member). What an export in one process spills, a row's values back to back (``BucketSpill.add``): the headers
    and padding (~20% of a shard's bytes for ~5 KB texts) are made when the shard is built
    (``datahub.shards.tar.header_blocks``), from these sizes and the keys: the same bytes as ``encoded_members``."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    columns = _member_columns(table.schema)
    one = table.combine_chunks().to_batches()
    if not one or not table.num_rows:
        return [], (), np.zeros((0, 0), dtype=np.int64)
    members = _members(one[0], *columns)
    sizes = np.column_stack([np.where(np.asarray(pc.is_valid(data)),
                                      np.asarray(pc.fill_null(pc.binary_length(data), 0), dtype=np.int64), -1)
                             for _, data in members])
    return [data for _, data in members], tuple(ext for ext, _ in members), sizes


def encoded_rows(batch: pa.RecordBatch | pa.Table) -> pa.LargeBinaryArray:
    """Every row's tar members back to back (``encode_tar`` of one batch, whatever its length)."""
    return encoded_members(batch)[0]


def encoded_members(batch: pa.RecordBatch | pa.Table) -> tuple[pa.LargeBinaryArray, tuple[str, ...], np.ndarray]:
    """``encoded_rows`` with the members' extensions (in row order, the same for every batch of one schema) and
    their data bytes per row (rows x extensions, int64; -1 where a row has no such member)."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    parts = list(_encode_tar(table, batch_rows=max(table.num_rows, 1)))
    if not parts:
        return pa.array([], pa.large_binary()), (), np.zeros((0, 0), dtype=np.int64)
    rows = parts[0][0] if len(parts) == 1 else pa.concat_arrays([p[0] for p in parts])
    extensions = tuple(ext for ext, _ in parts[0][1])
    sizes = np.concatenate([np.column_stack([s for _, s in layout]) for _, layout in parts]) if extensions else \
        np.zeros((len(rows), 0), dtype=np.int64)
    return rows, extensions, sizes
