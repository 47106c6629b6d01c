"""Spark session settings: master and conf from the spec, worker python, and a clear no-Java error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from datahub.config.spec import EngineSpec
from datahub.engines.spark.session import find_java, resolve_master, session_conf
from datahub.errors import TerminalError

REPO = Path(__file__).resolve().parents[2]
DATAHUB = str(Path(sys.executable).parent / "datahub")


def test_master_comes_from_the_spec_then_conf_then_spark_submit():
    assert resolve_master(EngineSpec(kind="spark"), {}) == "local[2]"
    assert resolve_master(EngineSpec(kind="spark", master="spark://h:7077"), {}) == "spark://h:7077"
    assert resolve_master(EngineSpec(kind="spark", conf={"spark.master": "yarn"}), {}) == "yarn"
    assert resolve_master(EngineSpec(kind="spark"), {"PYSPARK_GATEWAY_PORT": "4000"}) is None  # spark-submit's --master


def test_master_falls_back_to_the_spark_master_environment_variable():
    env = {"SPARK_MASTER": "spark://spark-master:7077"}  # what docker/compose.yaml sets
    assert resolve_master(EngineSpec(kind="spark"), env) == "spark://spark-master:7077"
    assert resolve_master(EngineSpec(kind="spark", master="local[1]"), env) == "local[1]"  # the spec wins
    assert resolve_master(EngineSpec(kind="spark", conf={"spark.master": "yarn"}), env) == "yarn"
    assert resolve_master(EngineSpec(kind="spark"), {**env, "PYSPARK_GATEWAY_PORT": "4000"}) is None
    assert resolve_master(EngineSpec(kind="spark"), {"SPARK_MASTER": ""}) == "local[2]"  # set but empty
    conf = session_conf(EngineSpec(kind="spark"), python="/py", environ=env)
    assert conf["spark.master"] == "spark://spark-master:7077"
    assert "spark.driver.bindAddress" not in conf  # the cluster's workers must reach the driver


def test_conf_is_quiet_local_and_user_conf_wins():
    conf = session_conf(EngineSpec(kind="spark", conf={"spark.sql.shuffle.partitions": "64"}), python="/py", environ={})
    assert conf["spark.master"] == "local[2]" and conf["spark.ui.enabled"] == "false"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1" and conf["spark.sql.shuffle.partitions"] == "64"
    assert conf["spark.pyspark.python"] == conf["spark.executorEnv.PYSPARK_PYTHON"] == "/py"
    remote = session_conf(EngineSpec(kind="spark", master="spark://10.0.0.5:7077"), python="/py", environ={})
    assert "spark.driver.bindAddress" not in remote  # a real cluster must reach the driver


def test_workers_run_this_interpreter(spark_engine):
    def where(batches):
        for batch in batches:
            yield pa.record_batch([pa.array([sys.executable] * batch.num_rows)], names=["python"])

    session = spark_engine.session
    assert session.sparkContext.pythonExec == sys.executable
    assert "PYSPARK_PYTHON" not in os.environ or os.environ["PYSPARK_PYTHON"] == sys.executable  # nothing else changed it
    seen = {row[0] for row in session.range(4).mapInArrow(where, "python string").collect()}
    assert seen == {sys.executable}


def test_find_java_explains_what_to_install(tmp_path):
    with pytest.raises(TerminalError, match="apt-get install openjdk-17-jre-headless"):
        find_java({"PATH": str(tmp_path)})
    with pytest.raises(TerminalError, match=f"JAVA_HOME={tmp_path} has no executable bin/java"):
        find_java({"JAVA_HOME": str(tmp_path), "PATH": os.environ["PATH"]})


def test_datahub_run_without_java_fails_with_the_fix(tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_GATEWAY_PORT")}
    env["PATH"] = str(empty_bin)  # no java anywhere
    result = subprocess.run(
        [DATAHUB, "run", "jobs/demo.yaml", "--engine", "spark", "--lake", str(tmp_path / "lake")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "needs Java" in result.stderr and "apt-get install openjdk-17-jre-headless" in result.stderr
    assert "JAVA_HOME" in result.stderr
    assert "Traceback" not in result.stderr
