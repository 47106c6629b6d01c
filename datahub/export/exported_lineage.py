"""The ``exported`` lineage events of an export, a token export or a tier copy: which file on which tier holds each
sample. One commit per export and tier (an idempotent app transaction: a re-run is a no-op), streamed one file's
keys at a time and written by ``materialize.commit_rows`` (one row group held; delta-rs's writer buffers up to a
target-size file of rows).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError
from datahub.lake.lake import SORTED_LAYOUT, Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.tables import LINEAGE
from datahub.release.materialize import commit_rows
from datahub.storage.tier import Tier


def commit_exported(lake: Lake, events: Iterable[tuple[pa.Array, pa.Array]], *, txn: str, op: str,
                    params_hash: str, metadata: Mapping[str, Any]) -> int | None:
    """``events`` (per file: sample ids and their refs, aligned) as ``exported`` lineage rows in one commit tagged
    ``txn`` (``run_id`` = ``txn``, one timestamp for all); returns the new lineage version, or None when ``txn`` was
    committed before (``events`` is then not read)."""
    if lake.applied("lineage", txn):
        return None
    now = datetime.now(timezone.utc)

    def rows() -> Iterator[pa.Table]:
        for keys, ref in events:
            yield lineage_rows(keys, run_id=txn, op=op, action="exported", params_hash=params_hash, ref=ref, ts=now)

    return commit_rows(lake, "lineage", rows(), schema=LINEAGE, txn=txn, row_group_rows=SORTED_LAYOUT["lineage"][1],
                       metadata={**metadata, EXPORT_KEY: params_hash})


def commit_shard_index(lake: Lake, release: str, tier: Tier, shards: Iterable[tuple[str, pa.Array]], *, op: str,
                       params_hash: str) -> int | None:
    """The shard index of ``release`` on ``tier`` (``shards``: each shard's name and its sample ids in shard order):
    ref ``{"shard": URI, "tier": NAME, "member": "SAMPLE_ID.txt"}``, txn ``export/{release}/{tier}``. What
    ``datahub export`` and a tier copy write, so both read the same."""

    def events() -> Iterator[tuple[pa.Array, pa.Array]]:
        for name, keys in shards:
            prefix = json.dumps({"shard": tier.uri(release, name), "tier": tier.name})[:-1] + ', "member": "'
            yield keys, pc.binary_join_element_wise(pa.scalar(prefix), keys, pa.scalar('.txt"}'), "")

    return commit_exported(lake, events(), txn=f"export/{release}/{tier.name}", op=op, params_hash=params_hash,
                           metadata={"datahub.export": release, "datahub.tier": tier.name})


EXPORT_KEY = "datahub.export_key"  # lineage commit metadata: the export key (settings) the exported rows stand for


def refuse_other_export(lake: Lake, txn: str, export_key: str, *, release: str, tier: str) -> None:
    """Refuse an export whose ``exported`` lineage commit (``txn``) is already in with another export key: a first
    try killed after that commit (before its manifest), re-run with other settings, would publish other shards while
    the lineage (its commit skipped as applied) names the first try's."""
    if not lake.exists("lineage") or not lake.applied("lineage", txn):
        return
    recorded = next((h.get(EXPORT_KEY) for h in lake.history("lineage") if h.get("datahub.txn") == txn), None)
    if recorded is None:  # committed by an older datahub: the key is on the rows
        import pyarrow.dataset as ds

        rows = lake.dataset("lineage").to_table(columns=["params_hash"], filter=ds.field("run_id") == txn)
        recorded = rows.column("params_hash")[0].as_py() if rows.num_rows else None
    if recorded is not None and recorded != export_key:
        raise ReleaseError(
            f"release {release!r} was half-exported to tier {tier} with other settings (export key {recorded}, this "
            f"run's is {export_key}): its lineage names that try's shards. Re-run the export with the first try's "
            "settings (table version, --shard-size/--shard-samples, --shuffle-seed; tokenizer and --file-tokens) to "
            "finish it, or export under a new release name")
