"""Spark engine (PySpark >= 4, Java 17): ``engine: {kind: spark}`` or ``datahub run JOB --engine spark``."""

from datahub.engines.spark.engine import SparkEngine
from datahub.engines.spark.frame import SparkFrame

__all__ = ["SparkEngine", "SparkFrame"]
