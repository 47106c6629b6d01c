"""SparkFrame has RayFrame's semantics: the same results for every Frame method, schemas from real rows."""

from __future__ import annotations

import datetime as dt
import json
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.engines.spark import SparkFrame
from datahub.errors import TerminalError
from datahub.operator import BatchOperator, add_quality_signals, apply_batch_operator
from tests.operators.dedup.arrow_frame import ArrowFrame


def rows(frame, columns=None):
    table = frame.to_arrow()
    if columns:
        table = table.select(columns)
    return sorted(table.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def people():
    return pa.table({
        "id": pa.array(["a", "b", "c", "d", "e", "f"]),
        "team": pa.array(["x", "x", "y", "y", "y", None]),
        "score": pa.array([3, 1, 4, 1, 5, 9], pa.int64()),
        "weight": pa.array([0.5, 1.5, None, 2.0, 1.0, 3.0]),
    })


def teams():
    return pa.table({"team": ["x", "y", "z"], "city": ["rome", "oslo", "lima"]})


def test_groupby_agg_matches_the_reference(spark_engine):
    aggs = {"low": ("score", "min"), "high": ("score", "max"), "total": ("score", "sum"), "n": ("id", "count"), "mass": ("weight", "sum")}
    table = spark_engine.from_arrow(people()).groupby_agg(["team"], aggs).to_arrow()
    assert table.schema.field("total").type == pa.int64() and table.schema.field("n").type == pa.int64()
    # "count" counts rows, as Ray's Count() does; a null team is its own group
    by_team = {r["team"]: r for r in table.to_pylist()}
    assert by_team["y"] == {"team": "y", "low": 1, "high": 5, "total": 10, "n": 3, "mass": 3.0}
    assert by_team["x"]["n"] == 2 and by_team[None]["total"] == 9
    assert len(by_team) == 3
    crowded = spark_engine.from_arrow(people()).groupby_agg(["team"], {"n": ("id", "count")}, having=_crowded).to_arrow()
    assert crowded.to_pylist() == [{"team": "y"}]


def _crowded(groups: pa.Table) -> pa.Table:
    import pyarrow.compute as pc

    return groups.filter(pc.greater(groups.column("n"), 2)).select(["team"])


@pytest.mark.parametrize("how", ["inner", "left", "left_anti"])
def test_joins_match_arrow(spark_engine, how):
    expected = rows(ArrowFrame(people()).join(ArrowFrame(teams()), on=["team"], how=how))
    got = spark_engine.from_arrow(people()).join(spark_engine.from_arrow(teams()), on=["team"], how=how)
    assert rows(got) == expected and len(expected) == {"inner": 5, "left": 6, "left_anti": 1}[how]
    assert set(got.empty().column_names) == set(expected[0])


def test_union_count_materialize_and_empty(spark_engine):
    left = spark_engine.from_arrow(people())
    right = spark_engine.from_arrow(people().slice(0, 2))
    both = left.union(right).materialize()
    assert both.count() == 8
    assert sorted(r["id"] for r in rows(both)) == sorted(list("abcdef") + ["a", "b"])
    assert both.empty().schema == people().schema
    assert spark_engine.from_arrow(people().slice(0, 0)).count() == 0


class _Score(BatchOperator):
    """Drops rows whose text starts with 'bad'; scores the others in the quality struct."""

    name = "test_score"
    annotates = True

    def process(self, table):
        text = table.column("text")
        table = add_quality_signals(table, {"length": pc.utf8_length(text), "tags": pa.array([["t"]] * table.num_rows, pa.list_(pa.string()))})
        return self.mark_dropped(table, pc.starts_with(text, "bad"), "bad_start")


def _docs(n=40):
    rng = random.Random(1)
    # the first half are all dropped by an earlier node: those batches never reach _Score.process
    texts = ["bad " + str(i) if i < n // 2 else f"good text {rng.random()}" for i in range(n)]
    return pa.table({
        "sample_id": [f"s{i:03d}" for i in range(n)],
        "text": texts,
        "_drop_reason": pa.array(["earlier"] * (n // 2) + [None] * (n - n // 2), pa.string()),
        "_drop_op": pa.array(["x@1"] * (n // 2) + [None] * (n - n // 2), pa.string()),
        "_drop_ref": pa.nulls(n, pa.string()),
    })


def test_batch_operator_schema_comes_from_real_rows_not_an_empty_batch(spark_engine):
    from functools import partial

    op = _Score()
    fn = partial(apply_batch_operator, op, node="score")
    # An empty batch never reaches process(): it would give a schema without `quality`.
    assert "quality" not in fn(_docs().slice(0, 0)).column_names
    frame = spark_engine.from_arrow(_docs()).map_batches(fn, name="score")
    schema = frame.schema
    assert schema.field("quality").type == pa.struct([("length", pa.int32()), ("tags", pa.list_(pa.string()))])
    # typed columns survive a join (a Spark plan needs the schema up front)
    ids = spark_engine.from_arrow(pa.table({"sample_id": [f"s{i:03d}" for i in range(0, 40, 2)]}))
    joined = frame.join(ids, on=["sample_id"]).to_arrow()
    assert joined.num_rows == 20 and joined.schema.field("quality").type == schema.field("quality").type
    got = {r["sample_id"]: r for r in frame.to_arrow().to_pylist()}
    assert got["s000"]["quality"] is None and got["s000"]["_drop_reason"] == "earlier"
    assert got["s030"]["quality"]["length"] == len(got["s030"]["text"]) and got["s030"]["_ev.score"] == "annotated"
    ray_rows = {r["sample_id"]: r for r in _ray_like(fn)}
    assert {k: (v["_drop_reason"], v["quality"]) for k, v in got.items()} == {k: (v["_drop_reason"], v["quality"]) for k, v in ray_rows.items()}


def _ray_like(fn):
    # the reference: plain pyarrow, batch by batch, as RayFrame's map_batches does
    return ArrowFrame(_docs(), batch_size=7).map_batches(fn).to_arrow().to_pylist()


def test_exotic_arrow_types_survive_spark(spark_engine):
    table = pa.table({
        "key": pa.array([1, 2, 3], pa.int64()),
        "big": pa.array([2**64 - 1, 0, 2**63], pa.uint64()),
        "digest": pa.array([b"0123456789abcdef", b"fedcba9876543210", None], pa.binary(16)),
        "nothing": pa.nulls(3),
        "when": pa.array([dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)] * 3, pa.timestamp("us", tz="UTC")),
        "long_text": pa.array(["x", "y", "z"], pa.large_string()),
        "words": pa.array([["a"], [], None], pa.list_(pa.string())),
    })
    frame = spark_engine.from_arrow(table).map_batches(lambda t: t, name="identity")
    other = spark_engine.from_arrow(pa.table({"key": pa.array([1, 2, 3], pa.int64()), "tag": ["p", "q", "r"]}))
    out = frame.join(other, on=["key"]).to_arrow().sort_by("key")
    assert out.select(table.column_names) == table
    # min/max keep the exact type: uint64 crosses Spark as decimal(20, 0), order intact
    top = spark_engine.from_arrow(table).groupby_agg(["nothing"], {"top": ("big", "max")}).to_arrow()
    assert top.schema.field("top").type == pa.uint64() and top.column("top").to_pylist() == [2**64 - 1]


def test_conflicting_batch_schemas_name_the_node(spark_engine):
    def flaky(table):
        kind = pa.int64() if table.column("key")[0].as_py() == 1 else pa.struct([("a", pa.int64())])
        return table.append_column("v", pa.nulls(table.num_rows, kind).fill_null(1) if kind == pa.int64() else pa.array([{"a": 1}] * table.num_rows, kind))

    table = pa.table({"key": pa.array([1, 2], pa.int64())})
    frame = spark_engine.from_arrow(table).map_batches(flaky, name="flaky_node")
    with pytest.raises(TerminalError, match="flaky_node"):
        frame.join(spark_engine.from_arrow(table), on=["key"])


def test_join_refuses_clashing_columns(spark_engine):
    with pytest.raises(TerminalError, match="rename"):
        spark_engine.from_arrow(people()).join(spark_engine.from_arrow(people()), on=["id"])


def test_read_files_is_one_task_per_file_and_streams(spark_engine, tmp_path):
    from operators.ingest.base import InputFile

    files = [InputFile(uri=str(tmp_path / f"f{i}"), size=1, format="text", etag=None, mtime="0") for i in range(3)]

    def read(file):
        for part in range(2):
            yield pa.table({"uri": [file.uri] * 5, "part": [part] * 5})

    frame = spark_engine.read_files(files, read)
    assert isinstance(frame, SparkFrame)
    batches = list(frame.iter_batches())
    assert len(batches) == 6 and all(b.num_rows == 5 for b in batches)
    assert frame.count() == 30
    assert frame.groupby_agg(["uri"], {"n": ("part", "count")}).to_arrow().column("n").to_pylist() == [10, 10, 10]


class _NoRows:
    def __call__(self, t: pa.Table) -> pa.Table:
        return t.filter(pa.array([False] * t.num_rows, pa.bool_())).select(["id", "team"])


def test_a_union_with_no_rows_keeps_its_columns_for_a_groupby(spark_engine):
    # No duplicates found: typed rows (a join's output) unioned with empty mapped blobs has no batch to
    # read a schema from; its sides give it ("Column sample_id does not exist" before).
    rows_side = spark_engine.from_arrow(people()).join(spark_engine.from_arrow(teams()), on=["team"]).map_batches(_NoRows())
    rows_side = rows_side.groupby_agg(["id"], {"team": ("team", "min")})
    blobs_side = spark_engine.from_arrow(people()).map_batches(_NoRows())
    both = rows_side.union(blobs_side)
    grouped = both.groupby_agg(["id"], {"team": ("team", "min")})
    assert grouped.count() == 0 and grouped.empty().schema.names == ["id", "team"]
