"""The keep rule as one sortable string per row, so "who is kept" is one ``min`` aggregate.

Keep rule (issue 3): inside a duplicate cluster keep the row with the best quality score
(a field of the ``quality`` struct named by ``keep_by``; higher wins, null/NaN lowest),
then the smallest ``sample_id``, then (rows sharing one sample_id, i.e. the same text in
two files) the smallest ``(source_uri, source_offset)``. Encoded as

    rank = score_key (16 chars) + sample_id + "\\x1f" + source_uri + "\\x1f" + offset (20 digits)

``score_key`` is the float's order-preserving bit pattern, inverted (so the best score sorts
first) and hex encoded; rows already in the lake get 16 spaces, which sort before any hex
digit, so an existing sample always wins over a new one. Strings compare byte-wise on Arrow,
Ray and Spark alike, so every engine picks the same keeper. ``\\x1f`` sorts below every
printable character, so it acts as a terminator and sample ids of any length compare right.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEPARATOR = "\x1f"
SCORE_WIDTH = 16
LAKE_SCORE = " " * SCORE_WIDTH  # sorts before every hex score: samples already in the lake win
_HEX = np.array([f"{i:02x}" for i in range(256)], dtype="S2")
_SIGN = np.uint64(1 << 63)


def score_keys(scores: pa.Array | pa.ChunkedArray | None, n: int) -> pa.Array:
    """16-char keys, ascending = best score first; no scores -> all equal keys."""
    if scores is None:
        return pa.array(["0" * SCORE_WIDTH] * n, pa.string())
    values = pc.cast(scores, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)
    values = np.where(np.isnan(values), -np.inf, values)  # null -> NaN -> lowest
    values = values + 0.0  # -0.0 -> +0.0: equal scores must give equal keys
    bits = values.view(np.uint64)
    # IEEE order-preserving map: negative floats flip all bits, positive ones the sign bit.
    ordered = np.where(bits & _SIGN, ~bits, bits | _SIGN)
    descending = (~ordered).astype(">u8")  # big-endian, so byte order = numeric order
    hexed = np.ascontiguousarray(_HEX[descending.view(np.uint8).reshape(n, 8)]).view(f"S{SCORE_WIDTH}").ravel()
    return pa.array(hexed, pa.binary(SCORE_WIDTH)).cast(pa.string())


def quality_scores(table: pa.Table, keep_by: str | None) -> pa.Array | pa.ChunkedArray | None:
    """The ``quality.<keep_by>`` column (null where absent), or None when no ``keep_by``."""
    if keep_by is None:
        return None
    if "quality" not in table.column_names:
        return pa.nulls(table.num_rows, pa.float64())
    quality = table.column("quality").combine_chunks()
    if not isinstance(quality.type, pa.StructType) or quality.type.get_field_index(keep_by) < 0:
        return pa.nulls(table.num_rows, pa.float64())
    return quality.field(keep_by)


def row_ranks(table: pa.Table, keep_by: str | None) -> pa.Array:
    """The rank string of every row (see module docstring); smaller is kept."""
    n = table.num_rows
    uri = pc.fill_null(pc.cast(table.column("source_uri"), pa.string()), "") if "source_uri" in table.column_names \
        else pa.array([""] * n, pa.string())
    if "source_offset" in table.column_names:
        offset = pc.fill_null(pc.cast(table.column("source_offset"), pa.int64()), 0)
        offset = pc.utf8_lpad(pc.cast(offset, pa.string()), width=20, padding="0")
    else:
        offset = pa.array(["0" * 20] * n, pa.string())
    ids = pc.cast(table.column("sample_id"), pa.string())
    # score + id without a separator (the score is fixed width), then uri and offset.
    head = pc.binary_join_element_wise(score_keys(quality_scores(table, keep_by), n), ids, "")
    return pc.binary_join_element_wise(head, uri, offset, SEPARATOR)


def lake_ranks(sample_ids: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Ranks of samples already in the lake: they sort before every new row."""
    return pc.binary_join_element_wise(LAKE_SCORE, pc.cast(sample_ids, pa.string()), SEPARATOR, "")


def rank_sample_ids(ranks: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The ``sample_id`` encoded in rank strings."""
    tail = pc.utf8_slice_codeunits(ranks, SCORE_WIDTH)
    return pc.list_element(pc.split_pattern(tail, SEPARATOR, max_splits=1), 0)


def is_lake_rank(ranks: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    return pc.starts_with(ranks, LAKE_SCORE)
