"""Export written by Spark tasks (groupBy(shard).applyInArrow): the same shards as one process."""

from __future__ import annotations

from pathlib import Path

from datahub.export import export_table_version
from tests.export.helpers import cfs_storage, make_lake


def test_spark_export_writes_the_bytes_of_a_local_export(tmp_path, spark_engine) -> None:
    lake, version = make_lake(tmp_path / "lake", 90, with_binary=True)
    storage = cfs_storage(("local", tmp_path / "local"), ("spark", tmp_path / "spark"))
    settings = {"shard_size": 16000, "shuffle_seed": 5}
    local = export_table_version(lake, table="samples", version=version, release_name="a", tier="local",
                                 storage=storage, **settings)
    spark = export_table_version(lake, table="samples", version=version, release_name="b", tier="spark",
                                 storage=storage, engine=spark_engine, workers=2, **settings)
    assert len(local.shards) > 2
    assert [Path(s.replicas["local"]).read_bytes() for s in local.shards] == \
        [Path(s.replicas["spark"]).read_bytes() for s in spark.shards]
