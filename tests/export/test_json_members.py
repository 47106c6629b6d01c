"""The ``.json`` member: built column by column (Arrow, orjson) only where that writes the json module's very bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import datahub.export.samples as samples
from datahub.export import export_table_version
from tests.export.helpers import cfs_storage, make_lake

pytest.importorskip("orjson")

_FLOATS = [0.0, -0.0, 1e-4, 9.99e-5, 1e-5, 1.5e-7, 5e-324, 0.1, 1 / 3, 123.456, 1e15, 9999999999999998.0, 1e16, 2.5e20,
           -1e-5, -1e16, 1.7976931348623157e308]


def _tricky() -> pa.Table:
    n = len(_FLOATS)
    metas = ['{"n": 1}', '{"b": 2, "a": [1, 2.5e-6]}', "not json", '{"a": NaN}', '{"big": 18446744073709551616}',
             '{"huge": 1e400}', '{"x": "\\u00e9\\n\\t\\u0001"}', None, '{"u": 18446744073709551615, "s": -9223372036854775808}',
             '{"e": 1E5, "z": 0.00001}', '[1, {"k": "v"}]', '"just a string"', "{\"a\": 1, \"a\": 2}",
             '{"plain": 12345678901234567890.5}', '{"ok": "3e5 inside a string"}', "  {\"ws\" : 1 }  ", '{"neg": -0}']
    return pa.table({
        "sample_id": [hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in range(n)],  # hex: "3e..." in strings
        "source_uri": ["file:///a\u2028b\x7f\"q\\", "é中🙂", "\x00\x1f", None] + ["x:1e5,[0.00001"] * (n - 4),
        "score": pa.array(_FLOATS, pa.float64()),
        "score32": pa.array([float(f) if abs(f) < 3e38 else 1.0 for f in _FLOATS], pa.float32()),
        "count": pa.array([2**64 - 1 - i for i in range(n)], pa.uint64()),
        "meta": metas[:n],
        "quality": [{"s": f, "w": i, "tags": ["a", None], "flag": i % 2 == 0} for i, f in enumerate(_FLOATS)],
        "lists": [[f, -f] if i % 3 else None for i, f in enumerate(_FLOATS)],
    })


def test_json_records_equal_the_json_module_on_edge_values() -> None:
    table = _tricky()
    columns = [c for c in table.column_names]
    fast = samples.json_records(table, columns).to_pylist()
    assert fast == samples._python_records(table, columns)
    assert fast[0] == json.dumps({c: table[c][0].as_py() if c != "meta" else {"n": 1} for c in columns}, sort_keys=True,
                                 ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("meta_type", [pa.string_view(), pa.dictionary(pa.int32(), pa.string()), pa.large_string()])
def test_meta_of_any_string_type_is_parsed_as_the_json_module_does(meta_type) -> None:
    metas = ['{"b": 1, "a": 2}', None, "not json", '{"b": 1, "a": 2}']
    table = pa.table({"sample_id": ["a", "b", "c", "d"], "meta": pa.array(metas).cast(meta_type)})
    records = samples.json_records(table, ["sample_id", "meta"]).to_pylist()
    assert records == samples._python_records(table, ["sample_id", "meta"])
    assert records[0] == b'{"meta":{"a":2,"b":1},"sample_id":"a"}'


def test_nan_infinity_and_unknown_types_take_the_json_module() -> None:
    table = pa.table({"sample_id": ["a", "b"], "score": [float("nan"), 1.0], "when": pa.array([1, 2], pa.timestamp("s"))})
    for columns in (["sample_id", "score"], ["sample_id", "when"]):
        records = samples.json_records(table, columns).to_pylist()
        assert records == samples._python_records(table, columns)
    assert samples.json_records(table, ["sample_id", "score"])[0].as_py() == b'{"sample_id":"a","score":NaN}'


@pytest.mark.parametrize("with_orjson", [True, False])
def test_columns_equal_the_json_module_on_many_values(monkeypatch, with_orjson) -> None:
    """Floats of every magnitude (plain decimals, exponents, integral, tiny), float32, nulls at each level, strings
    that need escapes among plain ones, sliced arrays: the column-wise bytes are the reference's, row for row."""
    if not with_orjson:
        monkeypatch.setattr(samples, "_orjson", None)
    rng = np.random.default_rng(11)
    n = 30_000
    values = np.concatenate([rng.uniform(0, 1, n // 3), np.exp(rng.uniform(-30, 60, n // 3)) * rng.choice([-1, 1], n // 3),
                             np.round(rng.uniform(-1e6, 1e6, n - 2 * (n // 3)))])
    rng.shuffle(values)
    present = rng.uniform(size=n) > 0.1
    texts = [None if i % 11 == 0 else (f"plain {i}" if i % 5 else f"needs \"escapes\"\n\\ {i}\x01") for i in range(n)]
    inner = pa.StructArray.from_arrays([pa.array(values, mask=~present), pa.array(texts), pa.array(values.astype(np.float32))],
                                       names=["z", "a", "m"], mask=pa.array(rng.uniform(size=n) < 0.05))
    plain = rng.uniform(0, 1, n) * 10.0 ** rng.integers(-3, 15, n)  # plain decimals only: the one-list path
    table = pa.table({"v": pa.array(values, mask=~present), "u": pa.array(plain, mask=~present), "s": texts, "q": inner,
                      "i": pa.array(rng.integers(-2**62, 2**62, n)), "b": pa.array(rng.uniform(size=n) < 0.5),
                      "meta": [None if i % 13 == 0 else f'{{"x": {values[i]!r}, "i": {i}}}' for i in range(n)]})
    for part in (table, table.slice(1234, 5000)):
        columns = part.column_names
        assert samples.json_records(part, columns).to_pylist() == samples._python_records(part, columns)


def _shard_digests(tmp: Path) -> list[str]:
    lake, version = make_lake(tmp / "lake", 90, with_binary=True)
    manifest = export_table_version(lake, table="samples", version=version, release_name="rel", tier="cfs",
                                    storage=cfs_storage(("cfs", tmp / "cfs")), shard_samples=25)
    return [s.sha256 for s in manifest.shards]


def test_export_without_orjson_writes_the_same_shards(tmp_path, monkeypatch) -> None:
    with_orjson = _shard_digests(tmp_path / "a")
    monkeypatch.setattr(samples, "_orjson", None)  # as if orjson were not installed
    table = _tricky()
    assert samples.json_records(table, table.column_names).to_pylist() == samples._python_records(table, table.column_names)
    assert _shard_digests(tmp_path / "b") == with_orjson
