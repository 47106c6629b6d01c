"""Evaluation-set registry and contamination checks.

``registry``: ``add_evalset`` stores a benchmark's prompts and answers as a new version of the lake's
``evalsets`` table (with ``ingested`` lineage rows per item), ``list_evalsets`` shows them.
``check``: ``contamination`` streams a table version in batches and counts samples sharing n-grams with the
registered sets (the release gate of ``datahub.release.create``). The operator that drops contaminated samples
in a pipeline is ``decontaminate`` (``operators/decontam``).
"""

from datahub.evalset.check import Contamination, contamination
from datahub.evalset.registry import EvalSet, add_evalset, list_evalsets, read_items

__all__ = ["Contamination", "EvalSet", "add_evalset", "contamination", "list_evalsets", "read_items"]
