"""Small real lakes for release tests: samples tables written with Lake.commit (no engine needed)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake import Lake
from datahub.lake.tables import QA_RESULTS, SAMPLES
from datahub.sample_id import sample_id_of


def sample_rows(texts: list[str], source: str, *, run_id: str = "job-000000000001") -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"sample_id": sample_id_of(t), "text": t, "source_uri": source, "source_offset": i,
             "source_format": "jsonl", "ingest_run_id": run_id, "meta": "{}"}
            for i, t in enumerate(texts)
        ],
        SAMPLES,
    )


def add_samples(lake: Lake, texts: list[str], source: str, *, table: str = "samples", run_id: str) -> int:
    version = lake.commit(table, sample_rows(texts, source, run_id=run_id), txn=run_id,
                          metadata={"datahub.run_id": run_id, "datahub.job": "job"})
    assert version is not None
    return int(lake.table(table).version())


def add_qa_result(lake: Lake, *, table: str, version: int, suite: str, success: bool,
                  failed: list[str] = (), run_id: str) -> None:
    results = [{"expectation": name, "kwargs": {"column": "text"}, "success": False, "observed": 0.5} for name in failed]
    results.append({"expectation": "expect_column_to_exist", "kwargs": {"column": "sample_id"}, "success": True})
    row = {"run_id": run_id, "table": table, "table_version": version, "suite": suite, "suite_version": "1",
           "success": success, "results": json.dumps(results), "ts": datetime.now(timezone.utc)}
    lake.commit("qa_results", pa.Table.from_pylist([row], QA_RESULTS), txn=f"qa/{run_id}")


def release_outcome(lake: Lake, name: str) -> tuple:
    """What a release is, to compare two ways of making it: its record (less the creation time), its rows in order
    and the lineage rows of its run (less their times)."""
    from datahub.release import get_release

    record = get_release(lake, name).as_dict()
    record.pop("created")
    rows = lake.read(record["table"], version=record["version"]).to_pylist()
    lineage = lake.read("lineage").drop_columns(["ts"])
    mine = lineage.filter(pc.equal(lineage.column("run_id"), f"release/{name}")).to_pylist()
    return record, rows, mine
