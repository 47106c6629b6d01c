"""The SparkSession datahub runs on: master and conf from the EngineSpec, Java checked first.

Master: ``engine.master`` (use ``master: ${SPARK_MASTER:-local[2]}`` in a spec to take it
from the environment), else ``engine.conf["spark.master"]``, else the master spark-submit
passed (``PYSPARK_GATEWAY_PORT`` set), else the ``SPARK_MASTER`` environment variable (what
docker/compose.yaml sets), else ``local[2]``. Workers run this interpreter
(``sys.executable``, so they find pyarrow and datahub) unless ``spark.pyspark.python`` is set.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from datahub.engines.cluster import check_spark_master
from datahub.engines.cpus import usable_cpus
from datahub.engines.spark.quiet import driver_log_options, pandas_notice_ignored
from datahub.errors import EngineUnavailableError, MissingDependencyError, TerminalError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from datahub.config.spec import EngineSpec

DEFAULT_MASTER = "local[2]"
MASTER_ENV = "SPARK_MASTER"  # read only by resolve_master
JAVA_HINT = (
    "install a Java 17 (or 21) runtime, e.g. `apt-get install openjdk-17-jre-headless` on Debian/Ubuntu, "
    "or set JAVA_HOME to a JDK/JRE directory that has bin/java"
)


def find_java(environ: Mapping[str, str]) -> str:
    """The java executable Spark's launcher will use (JAVA_HOME first, then PATH), or a clear error."""
    java_home = environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
        raise TerminalError(f"the Spark engine needs Java: JAVA_HOME={java_home} has no executable bin/java; {JAVA_HINT}")
    found = shutil.which("java", path=environ.get("PATH", ""))
    if found is None:
        raise TerminalError(f"the Spark engine needs Java, but JAVA_HOME is not set and no `java` is on PATH; {JAVA_HINT}")
    return found


def resolve_master(spec: EngineSpec, environ: Mapping[str, str]) -> str | None:
    """The master URL to set, or None when spark-submit already chose one."""
    if spec.master:
        return spec.master
    if "spark.master" in spec.conf:
        return spec.conf["spark.master"]
    if environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit: its --master wins
        return None
    return environ.get(MASTER_ENV) or DEFAULT_MASTER


def _is_local(master: str | None) -> bool:
    return master is not None and (master.startswith("local") or "//127.0.0.1" in master or "//localhost" in master)


def _local_cores(master: str) -> int:
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    return usable_cpus() if inside.startswith("*") else max(1, int(inside.split(",")[0]))


def session_conf(spec: EngineSpec, *, python: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Spark conf for ``spec``: quiet, UTC, workers on ``python``; ``engine.conf`` overrides all of it."""
    master = resolve_master(spec, environ)
    conf: dict[str, str] = {
        "spark.app.name": "datahub",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",  # Arrow timestamps cross the JVM as UTC
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        "spark.executorEnv.PYSPARK_PYTHON": python,
        "spark.executorEnv.PYTHONWARNINGS": "ignore::FutureWarning",  # pyspark's pandas-version notice
        "spark.driver.memory": "2g",
    }
    if master is not None:
        conf["spark.master"] = master
    if master is not None and master.startswith("local"):
        conf["spark.sql.shuffle.partitions"] = str(max(4, 2 * _local_cores(master)))
    conf.update(driver_log_options(environ))  # the driver JVM's start-up notices stay out of a cron log
    if _is_local(master):  # an embedded or loopback cluster: never listen on other interfaces
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
    conf.update(spec.conf)
    return conf


def build_session(spec: EngineSpec, *, environ: Mapping[str, str] | None = None) -> SparkSession:
    """Start (or join) a SparkSession configured from ``spec``."""
    env = os.environ if environ is None else environ
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise MissingDependencyError(f"the Spark engine needs pyspark ({exc}); install it with: pip install 'datahub[spark]'") from exc
    find_java(env)
    conf = session_conf(spec, python=sys.executable, environ=env)
    # an unreachable master costs Spark a minute of retries and pages of Java stack traces before it gives up
    check_spark_master(conf.get("spark.master"))
    builder: Any = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        with pandas_notice_ignored():  # pyspark's pandas-3 notice on its first session (datahub passes it no pandas)
            session = builder.getOrCreate()
    except Exception as exc:
        master = conf.get("spark.master") or ""
        # a spark:// port that listens but is not a master: Spark retries it for a minute, stops its context and
        # pyspark raises a Py4JJavaError about the stopped context, which the CLI showed as a traceback
        if not master.startswith("spark://") or "stopped SparkContext" not in str(exc):
            raise
        raise EngineUnavailableError(
            f"the Spark master {master} did not take this application (Spark gave up: all masters unresponsive); "
            "a port answers there, but not as a Spark standalone master: check the master URL (the master's web "
            "UI, port 8080, shows it); --address / engine.master / spark.master / SPARK_MASTER") from None
    configure_context(session, conf)
    return session


def configure_context(session: SparkSession, conf: Mapping[str, str]) -> None:
    """Per-context settings Spark does not take from conf: worker python and log level."""
    context = session.sparkContext
    # pyspark reads only PYSPARK_PYTHON for its workers; set it on this context, not in os.environ.
    context.pythonExec = conf.get("spark.pyspark.python", sys.executable)
    context.setLogLevel(conf.get("spark.log.level", "WARN"))
