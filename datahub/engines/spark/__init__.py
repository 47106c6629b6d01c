"""Spark engine (PySpark >= 4.0, Java 17): ``engine: {kind: spark}`` or ``datahub run JOB --engine spark``.

PySpark 4.0 is the floor (pyproject's ``spark`` extra says the same): frames cut their plans with
``DataFrame.localCheckpoint(storageLevel=...)``, new in 4.0; tested with the installed 4.3.
"""

from datahub.engines.spark.engine import SparkEngine
from datahub.engines.spark.frame import SparkFrame

__all__ = ["SparkEngine", "SparkFrame"]
