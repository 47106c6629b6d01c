"""datahub: a data-lake pipeline framework for LLM training corpora.

Heavy dependencies (ray, pyspark, great_expectations, torch) are imported where used,
so ``import datahub`` and ``datahub --help`` stay fast.
"""

__version__ = "0.1.0"
