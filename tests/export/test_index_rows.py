"""The row-wise shard index (``index_rows``) the export builds from its rows' offsets: the same index, and so the
same ``__index__`` member bytes, as a parse of the tar headers (``index_tar``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from datahub.export.samples import encoded_rows
from datahub.shards.index import index_member, index_rows, index_tar


def _rows() -> tuple[pa.Table, bytes, np.ndarray]:
    rng = np.random.default_rng(11)
    n = 300
    texts = ["x" * int(k) for k in rng.integers(0, 2000, n)]
    images = [None if i % 7 == 0 else bytes(rng.integers(0, 256, int(k), dtype=np.uint8))
              for i, k in enumerate(rng.integers(0, 1500, n))]  # null: the row has no such member
    table = pa.table({"sample_id": [f"id-{i:05d}" for i in range(n)], "text": texts,
                      "png": pa.array(images, pa.binary()), "source_offset": pa.array(range(n), pa.int64())})
    members = encoded_rows(table)
    offsets = np.frombuffer(members.buffers()[1], dtype=np.int64)[:n + 1]
    return table, members.buffers()[2].to_pybytes()[:int(offsets[-1])], offsets


def test_index_rows_equals_the_header_parse() -> None:
    table, data, offsets = _rows()
    keys = table["sample_id"].to_pylist()
    walked, parsed = index_rows(data, offsets, keys), index_tar(data)
    assert walked.keys == parsed.keys
    for field in ("member_sample", "member_offset", "member_size"):
        assert np.array_equal(getattr(walked, field), getattr(parsed, field))
    assert [walked.extensions[c] for c in walked.member_ext] == [parsed.extensions[c] for c in parsed.member_ext]
    assert index_member(walked, len(data)) == index_member(parsed, len(data))
    assert sorted(walked.extensions) == ["json", "png", "txt"]


def test_index_rows_falls_back_to_the_parse_when_rows_do_not_match() -> None:
    table, data, offsets = _rows()
    keys = table["sample_id"].to_pylist()
    wrong_keys = [keys[1], keys[0], *keys[2:]]  # names that are not the rows' keys
    assert index_rows(data, offsets, wrong_keys).keys == keys
    shifted = offsets.copy()
    shifted[5] += 512  # a row boundary inside a member
    assert index_rows(data, shifted, keys).keys == keys


def test_a_local_export_indexes_its_shards_from_the_encoder_sizes() -> None:
    """A local export builds each shard's ``__index__`` from the member sizes its encoder reported: the very bytes
    ``index_rows`` finds in the rows, also for a shard where a member kind never occurs (no png in rows 14-20)."""
    from datahub.export.export import _listing
    from datahub.export.samples import encoded_members

    table, data, offsets = _rows()
    table = table.set_column(2, "png", pa.array([None if 14 <= i <= 20 else v for i, v in enumerate(table["png"].to_pylist())],
                                               pa.binary()))
    rows, extensions, sizes = encoded_members(table)
    assert extensions == ("txt", "json", "png")
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int64)[:len(rows) + 1]
    data = rows.buffers()[2].to_pybytes()[:int(offsets[-1])]
    keys = table["sample_id"].to_pylist()
    for start, stop in ((0, len(keys)), (14, 21), (10, 30), (299, 300)):
        part = data[int(offsets[start]):int(offsets[stop])]
        walked = index_rows(part, offsets[start:stop + 1] - offsets[start], keys[start:stop])
        listed = _listing(extensions, sizes[start:stop], keys[start:stop])
        assert listed.extensions == tuple(e for e in extensions if e in walked.extensions)
        assert index_member(listed, len(part)) == index_member(walked, len(part)) != b""
