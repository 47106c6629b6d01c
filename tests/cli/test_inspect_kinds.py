"""``datahub inspect TABLE`` counts rows per kind from the Delta log's per-file statistics where a data file holds
one kind (min == max, or only nulls: text), and reads the ``kind`` column of the other files only: before, every data
file was read (8,000+ requests for a table of 4,000 files on S3, on every ``inspect samples``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.kinds.names import DEFAULT_KIND, KIND_COLUMN
from datahub.lake import Lake
from datahub.lake.describe import describe_lake
from datahub.lake.scan import scan_batches
from tests.release.helpers import sample_rows

REPO = Path(__file__).resolve().parents[2]
# one commit (one data file) each: one kind, one kind and nulls, only nulls, two kinds, two kinds and nulls
FILES = [["chat"] * 4, ["preference"] * 2, ["chat", None, "chat"], [None, None], ["chat", "trajectory", "chat"],
         ["image_text", None, "preference"], ["image_text"] * 3]
MIXED = {4, 5}  # the files whose rows must be read


def _lake(root: Path) -> tuple[Lake, list[str]]:
    """The table and the data file of each commit, in ``FILES`` order."""
    lake = Lake(root)
    paths: list[str] = []
    for index, kinds in enumerate(FILES):
        rows = sample_rows([f"file {index} document {i}" for i in range(len(kinds))], "a.jsonl")
        lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(kinds, pa.string())),
                    txn=f"job-{index:012x}")
        new = set(pa.table(lake.table("samples").get_add_actions(flatten=True)).column("path").to_pylist())
        (added,) = new - set(paths)
        paths.append(added)
    return lake, paths


def _scanned(lake: Lake) -> dict[str, int]:
    """Rows per kind from every row's kind column (what inspect showed before)."""
    counts: dict[str, int] = {}
    for batch in scan_batches(lake.dataset("samples"), columns=[KIND_COLUMN]):
        for entry in pc.value_counts(pc.fill_null(batch.column(0), DEFAULT_KIND)).to_pylist():
            counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def test_inspect_counts_kinds_from_file_statistics_and_reads_only_mixed_files(tmp_path):
    lake, paths = _lake(tmp_path / "lake")
    expected = _scanned(lake)
    assert expected == {"chat": 8, "image_text": 4, "preference": 3, "text": 4, "trajectory": 1}
    # every single-kind file is made unreadable: the counts must come from the Delta log for them
    table_dir = Path(lake.table_uri("samples"))
    for index, path in enumerate(paths):
        if index not in MIXED:
            (table_dir / path).write_bytes(b"not parquet any more")
    info = describe_lake(lake, "samples")["tables"]["samples"]
    assert info["kinds"] == expected and list(info["kinds"]) == list(expected)  # same counts, same order
    done = subprocess.run([sys.executable, "-m", "datahub.cli.main", "inspect", "--lake", lake.root, "samples",
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tables"]["samples"]["kinds"] == expected


def test_a_mixed_file_is_still_read(tmp_path):
    """A file of two kinds cannot be counted from min/max: breaking it breaks the count (it is read)."""
    lake, paths = _lake(tmp_path / "lake")
    (Path(lake.table_uri("samples")) / paths[4]).write_bytes(b"not parquet any more")
    try:
        describe_lake(lake, "samples")
    except Exception as error:  # noqa: BLE001 - pyarrow's or the lake's error: either says the file was read
        assert "parquet" in str(error).lower() or paths[4] in str(error), error
    else:
        raise AssertionError("a mixed file was counted without being read")


def _delete_with_a_deletion_vector(lake: Lake) -> None:
    """Commit what Spark's DELETE writes with ``delta.enableDeletionVectors`` (Databricks' default for new tables):
    protocol 3/7 with the deletionVectors feature, and the only data file removed and added back with a deletion
    vector of 2 rows (its statistics unchanged but for ``tightBounds: false``)."""
    log = Path(lake.table_uri("samples")) / "_delta_log"
    (add,) = [json.loads(line)["add"] for line in (log / f"{0:020d}.json").read_text().splitlines() if '"add"' in line]
    stats = {**json.loads(add["stats"]), "tightBounds": False}
    deletion_vector = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1,
                       "sizeInBytes": 36, "cardinality": 2}
    now = 1_765_000_000_000
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
        {"commitInfo": {"timestamp": now, "operation": "DELETE", "operationParameters": {"predicate": "[]"}}},
        {"remove": {"path": add["path"], "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                    "partitionValues": add["partitionValues"], "size": add["size"]}},
        {"add": {**add, "modificationTime": now, "stats": json.dumps(stats), "deletionVector": deletion_vector}},
    ]
    (log / f"{1:020d}.json").write_text("".join(json.dumps(action) + "\n" for action in actions))


def test_a_table_with_deletion_vectors_is_not_counted_from_statistics(tmp_path):
    """A file's ``numRecords`` counts the rows its deletion vector deletes: 4 'chat' rows, 2 of them deleted, were
    counted as 4 from the log. Such a table goes through the scan, which refuses it as before (pyarrow cannot apply
    deletion vectors), rather than show counts the table does not hold."""
    from datahub.lake.describe import kind_counts

    lake = Lake(tmp_path / "lake")
    rows = sample_rows([f"doc {i}" for i in range(4)], "a.jsonl")
    lake.commit("samples", rows.append_column(KIND_COLUMN, pa.array(["chat"] * 4, pa.string())), txn="job-000000000001")
    assert kind_counts(lake, "samples") == {"chat": 4}
    _delete_with_a_deletion_vector(lake)
    assert "deletionVectors" in (lake.table("samples").protocol().reader_features or [])
    with pytest.raises(Exception, match="deletionVectors") as refused:
        kind_counts(lake, "samples")
    with pytest.raises(type(refused.value)):  # the scan's own refusal: the same error as reading the rows
        lake.dataset("samples")
    assert kind_counts(lake, "samples", 0) == {"chat": 4}  # the version before the delete has none
