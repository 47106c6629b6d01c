"""Arrow schemas of the lake tables (the contracts in docs/design.md). Versioned by SCHEMA_VERSION."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

SCHEMA_VERSION = "1"
SCHEMA_VERSION_PROPERTY = "datahub.schemaVersion"

TABLE_NAMES = ("samples", "quarantine", "lineage", "runs", "qa_results", "minhash_index", "releases")

# `quality` is a struct of signals that quality operators add; its fields evolve (schema merge).
SAMPLES = pa.schema(
    [
        ("sample_id", pa.string()),
        ("text", pa.string()),
        ("source_uri", pa.string()),
        ("source_offset", pa.int64()),
        ("source_format", pa.string()),
        ("ingest_run_id", pa.string()),
        ("meta", pa.string()),
    ]
)



def not_of_samples(table: str, columns: Sequence[str], *, reads: str, lake_ref: str) -> str | None:
    """Why ``table`` (its ``columns``) is not a table of samples (no ``sample_id`` and ``text``: e.g. quarantine's raw
    records), naming its columns and the fix; None when it is one. ``reads`` says who needs samples."""
    if "sample_id" in columns and "text" in columns:
        return None
    return (f"table {table!r} is not a table of samples (no sample_id and text columns; it has {', '.join(columns)}); "
            f"{reads}, e.g. --table samples"
            + (f"; the quarantined records are listed by: datahub quarantine --lake {lake_ref}"
               if table == "quarantine" else ""))


QUARANTINE = pa.schema(
    [
        ("source_uri", pa.string()),
        ("source_offset", pa.int64()),
        ("source_format", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("raw", pa.binary()),  # the first bytes of the bad record, for inspection
        ("raw_size", pa.int64()),
        ("run_id", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)

LINEAGE = pa.schema(
    [
        ("sample_id", pa.string()),
        ("run_id", pa.string()),
        ("op", pa.string()),
        ("params_hash", pa.string()),
        ("action", pa.string()),
        ("reason", pa.string()),
        ("ref", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)
LINEAGE_ACTIONS = ("ingested", "modified", "annotated", "dropped", "quarantined", "released", "exported")

RUN_INPUT = pa.struct([("uri", pa.string()), ("size", pa.int64()), ("etag", pa.string()), ("mtime", pa.string())])
RUNS = pa.schema(
    [
        ("run_id", pa.string()),
        ("job_name", pa.string()),
        ("job_hash", pa.string()),
        ("engine", pa.string()),
        ("status", pa.string()),  # succeeded | failed
        ("started", pa.timestamp("us", tz="UTC")),
        ("finished", pa.timestamp("us", tz="UTC")),
        ("operators", pa.list_(pa.string())),
        ("inputs", pa.list_(RUN_INPUT)),
        ("counts", pa.string()),  # JSON: records_read, samples_written, dropped{reason: n}, quarantined
        ("table_versions", pa.string()),  # JSON: {table: delta version written}
        ("error", pa.string()),
        # Added after schema version 1 (nullable; older lakes lack them and read as null, merged on
        # the next commit): how to re-run this job, for `datahub runs`.
        ("job_spec", pa.string()),  # absolute path of the job spec file; null when run from Python
        ("full", pa.bool_()),  # run with --full
    ]
)

# One row per (run, suite): a failed suite makes that table version not releasable.
QA_RESULTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("table", pa.string()),
        ("table_version", pa.int64()),
        ("suite", pa.string()),
        ("suite_version", pa.string()),
        ("success", pa.bool_()),
        ("results", pa.string()),  # JSON list: [{expectation, kwargs, success, observed}]
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)
