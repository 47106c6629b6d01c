"""What datahub keeps out of a Spark run's stderr (a cron or Airflow log), and what it leaves there.

- The driver JVM logs through ``log4j2.properties`` next to this module: warnings and errors as Spark's own default
  does, minus the start-up notices that ask nothing of the user (the loopback-hostname warning of
  ``org.apache.spark.util.Utils``, Hadoop's missing native library), and without Spark's "Using Spark's default log4j
  profile" / "Setting default log level" lines, which Spark prints only when it falls back to its defaults. A
  ``log4j2.properties`` in ``SPARK_CONF_DIR`` (or ``$SPARK_HOME/conf``), or ``spark.driver.extraJavaOptions`` in
  ``engine.conf``, wins over this one. The JVM's own "Using incubator modules" line is not log4j's and stays.
- pyspark warns "does not yet fully support pandas >= 3.0.0" on its first session and on every ``mapInArrow`` and
  ``applyInArrow``; datahub passes Arrow, never pandas, through them, so ``pandas_notice_ignored`` drops that one
  FutureWarning around these calls only (other warnings, and the same notice from the user's own pyspark code, show).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")
PANDAS_NOTICE = r"PySpark does not yet fully support pandas"


@contextmanager
def pandas_notice_ignored() -> Iterator[None]:
    """pyspark's pandas-version FutureWarning ignored inside the block (only that warning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PANDAS_NOTICE, category=FutureWarning)
        yield


def map_in_arrow(df: Any, fn: Any, schema: Any) -> Any:
    """``df.mapInArrow(fn, schema)`` without pyspark's pandas notice."""
    with pandas_notice_ignored():
        return df.mapInArrow(fn, schema)


def user_log_config(environ: Mapping[str, str]) -> bool:
    """Whether the user configured Spark's logging through a conf directory (its log4j2 file is then used)."""
    conf_dir = environ.get("SPARK_CONF_DIR") or (
        os.path.join(environ["SPARK_HOME"], "conf") if environ.get("SPARK_HOME") else None)
    return conf_dir is not None and any(
        os.path.exists(os.path.join(conf_dir, name)) for name in ("log4j2.properties", "log4j2.xml", "log4j2.yaml"))


def driver_log_options(environ: Mapping[str, str]) -> dict[str, str]:
    """Spark conf that points the driver JVM at datahub's log4j2 config, unless the user has their own."""
    if user_log_config(environ):
        return {}
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"}
