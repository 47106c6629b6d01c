"""A Spark run's stderr in a cron log: the run's own lines, not log4j start-up notices or pyspark's pandas notice."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow as pa

from datahub.config.spec import EngineSpec
from datahub.engines.spark.quiet import LOG4J2_CONFIG, driver_log_options, map_in_arrow
from datahub.engines.spark.session import session_conf

REPO = Path(__file__).resolve().parents[2]
DATAHUB = str(Path(sys.executable).parent / "datahub")
LOG4J_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN) ", re.MULTILINE)


def test_a_small_spark_run_prints_no_log4j_notices_and_no_pandas_warning(tmp_path):
    with open(tmp_path / "in.jsonl", "w") as out:
        for i in range(20):
            out.write(json.dumps({"text": "word " * (30 + i) + str(i)}) + "\n")
    (tmp_path / "job.yaml").write_text(
        "name: quiet\nengine: {kind: spark}\nlake: {root: ./lake}\ninputs:\n  - uri: in.jsonl\ngraph:\n"
        "  length: {op: length_filter, params: {min_words: 20}}\n  samples: {sink: samples, after: [length]}\n")
    result = subprocess.run([DATAHUB, "run", "job.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "samples written    20" in result.stdout
    stderr = result.stderr
    assert not LOG4J_LINE.findall(stderr), stderr[-3000:]
    for notice in ("log4j profile", "Setting default log level", "FutureWarning", "fully support pandas"):
        assert notice not in stderr, stderr[-3000:]
    assert "run quiet" in stderr  # the run's own progress lines are still there


def test_map_in_arrow_drops_only_the_pandas_notice(spark_engine):
    def same(batches):
        yield from batches

    df = spark_engine.session.range(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df.mapInArrow(same, "id long")  # pyspark's own call: the notice (pandas >= 3 installed)
        seen_bare = [w for w in caught if "fully support pandas" in str(w.message)]
        del caught[:]
        rows = map_in_arrow(df, same, "id long").collect()
        warnings.warn("a user's own FutureWarning", FutureWarning)
    import pandas

    if pandas.__version__ >= "3":
        assert seen_bare, "pyspark no longer warns about pandas 3: the filter may go"
    assert [str(w.message) for w in caught] == ["a user's own FutureWarning"]
    assert pa.array([r.id for r in rows]).to_pylist() == [0, 1, 2]


def test_the_driver_log_config_yields_to_the_users(tmp_path):
    assert LOG4J2_CONFIG.is_file()
    ours = session_conf(EngineSpec(kind="spark"), python="/py", environ={})
    assert ours["spark.driver.extraJavaOptions"] == f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"
    theirs = session_conf(EngineSpec(kind="spark", conf={"spark.driver.extraJavaOptions": "-Dx=1"}), python="/py",
                          environ={})
    assert theirs["spark.driver.extraJavaOptions"] == "-Dx=1"
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = info\n")
    assert driver_log_options({"SPARK_CONF_DIR": str(tmp_path)}) == {}
    assert driver_log_options({"SPARK_HOME": str(tmp_path.parent)}) != {}  # no conf/ there
