"""Per-sample lineage: one sample's story, one input file's fate, OpenLineage run events.

The ``lineage`` Delta table is written by the pipeline (ingested, modified, annotated,
dropped, quarantined), by releases (released, redaction drops) and by export (exported).
"""

from datahub.pipeline.openlineage import OpenLineageEmitter, emit_run_event, run_event, run_uuid
from datahub.lineage.optimize import optimize_lineage
from datahub.lineage.query import SampleStory, SourceStory, lineage_events, sample_lineage, source_lineage

__all__ = [
    "OpenLineageEmitter",
    "SampleStory",
    "SourceStory",
    "emit_run_event",
    "lineage_events",
    "optimize_lineage",
    "run_event",
    "run_uuid",
    "sample_lineage",
    "source_lineage",
]
