"""``holds_newline`` (the ``.ids`` check: one numpy scan of the ids' bytes) agrees with ``pc.match_substring`` on
slices, chunked and large arrays, and never looks at bytes outside the slice it is given."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.errors import IntegrityError
from datahub.shards import indexed
from datahub.shards.indexed import encode_ids, holds_newline


def _reference(ids: pa.Array | pa.ChunkedArray) -> bool:
    return bool(pc.any(pc.match_substring(ids.cast(pa.string()), "\n")).as_py() or False)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary()])
def test_holds_newline_agrees_with_match_substring(kind) -> None:
    rng = np.random.default_rng(3)
    alphabet = np.array(list("ab-_09\n"))
    for _ in range(200):
        count = int(rng.integers(0, 12))
        values = ["".join(rng.choice(alphabet, size=int(rng.integers(0, 6)), p=[.16] * 6 + [.04])) for _ in range(count)]
        ids = pa.array(values, kind)
        begin = int(rng.integers(0, count + 1))
        part = ids.slice(begin, int(rng.integers(0, count - begin + 1)))  # bytes outside the slice are not looked at
        assert holds_newline(part) == _reference(part), (values, begin, len(part))
        chunked = pa.chunked_array([ids.slice(0, begin), ids.slice(begin)], kind)
        assert holds_newline(chunked) == _reference(chunked)


def test_holds_newline_scans_past_one_window(monkeypatch) -> None:
    monkeypatch.setattr(indexed, "_NEWLINE_WINDOW", 7)
    ids = pa.array(["abcdef"] * 20 + ["x\n"] + ["abc"] * 5)
    assert holds_newline(ids) and not holds_newline(ids.slice(0, 20)) and not holds_newline(ids.slice(21))
    assert holds_newline(ids.slice(20, 1)) and not holds_newline(pa.array([], pa.string()))


def test_encode_ids_refuses_a_newline_and_a_null() -> None:
    assert encode_ids(pa.array(["a", "b"])) == b"a\nb\n"
    for bad in (["a", "b\nc"], ["a", None]):
        with pytest.raises(IntegrityError, match="newline"):
            encode_ids(pa.array(bad, pa.string()))
