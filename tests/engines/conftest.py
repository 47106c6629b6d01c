"""One embedded Spark (local[2]) for the whole test session, quiet and bound to 127.0.0.1."""

from __future__ import annotations

import socket

import pytest

SPARK_TEST_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
}


@pytest.fixture(scope="session")
def spark_engine():
    from datahub.config.spec import EngineSpec
    from datahub.engines.spark import SparkEngine

    engine = SparkEngine(EngineSpec(kind="spark", master="local[2]", conf=SPARK_TEST_CONF))
    engine.start()
    yield engine
    engine.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
