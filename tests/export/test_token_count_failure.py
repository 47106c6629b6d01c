"""The Ray token export's count pass (a task per data file tokenizes it and stages its tokens on the tier): a task
that fails stops the others before the error reaches the caller, and the error names the cause. Ray Data's
executor cancelled them without waiting, so they went on staging files after the export had raised."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datahub.errors import IntegrityError
from datahub.export.source import TableSource
from datahub.export.tokens import LoadedTokenizer, export_table_tokens, load_tokenizer
from datahub.lake import Lake
from tests.engines.task_locks import START_WAIT_S, assert_stopped, fail_once_running
from tests.export.helpers import cfs_storage
from tests.export.test_tokens import train_tokenizer

pytest.importorskip("tokenizers")


@dataclass(frozen=True)
class _LockingTokenizer(LoadedTokenizer):
    """The real tokenizer; in ``folder``, a data file's texts ``task N ...`` run ``fail_once_running(N)`` first:
    task ``failing`` raises once another task runs, task ``quick`` returns then, the others hold their lock."""

    folder: str = ""
    failing: int = 0
    quick: int = -1

    def encode(self, texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        task = int(str(texts[0]).split()[1])
        if task == self.quick:  # neither fails nor holds a lock: returns once another task runs
            deadline = time.monotonic() + START_WAIT_S
            while not any(Path(self.folder).glob("running-*")) and time.monotonic() < deadline:
                time.sleep(0.02)
        else:
            fail_once_running(self.folder, task, failing=self.failing)
        return super().encode(texts)


def _lake(root: Path) -> tuple[Lake, int]:
    lake = Lake(root)
    version = None
    for task in range(3):  # three data files: three count tasks
        ids = [hashlib.sha256(f"doc {task} {i}".encode()).hexdigest()[:32] for i in range(20)]
        texts = [f"task {task} document {i} " + "word " * i for i in range(20)]
        version = lake.commit("samples", pa.table({"sample_id": ids, "text": texts,
                                                    "source_uri": ["file:///in.jsonl"] * 20}), txn=f"seed/{task}")
    assert version is not None
    return lake, version


def test_a_failed_count_task_of_a_ray_token_export_leaves_no_task_running(tmp_path: Path, ray_engine) -> None:
    lake, version = _lake(tmp_path / "lake")
    files = TableSource(lake, "samples", version).files()
    assert len(files) == 3
    first = next(TableSource(lake, "samples", version).scan(["text"], files=files[:1]))
    failing = int(str(first.column("text")[0]).split()[1])  # the first file's task: it starts at once
    loaded = load_tokenizer(train_tokenizer(tmp_path / "tok.json"))
    storage = cfs_storage(("ray", tmp_path / "ray"))
    folder = tmp_path / "locks"
    folder.mkdir()
    tokenizer = _LockingTokenizer(loaded.json, loaded.info, folder=str(folder), failing=failing)
    with pytest.raises(Exception, match=f"task {failing} fails"):
        export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=tokenizer,
                            tier="ray", storage=storage, file_tokens=200, engine=ray_engine, workers=2)
    assert_stopped(folder)


def test_a_plan_that_fails_on_a_counted_file_ends_the_count_tasks_in_flight(tmp_path: Path, ray_engine) -> None:
    """The driver raises (null sample_ids in the first file's counts) while another file's count task runs: the
    export ends that task before its error reaches the caller."""
    lake = Lake(tmp_path / "lake")
    version = None
    for task in range(3):
        version = lake.commit("samples", pa.table({"sample_id": pa.nulls(20, pa.string()),
                                                    "text": [f"task {task} document {i}" for i in range(20)],
                                                    "source_uri": ["file:///in.jsonl"] * 20}), txn=f"seed/{task}")
    assert version is not None
    files = TableSource(lake, "samples", version).files()
    first = next(TableSource(lake, "samples", version).scan(["text"], files=files[:1]))
    quick = int(str(first.column("text")[0]).split()[1])  # the first file's task: its counts reach the plan first
    loaded = load_tokenizer(train_tokenizer(tmp_path / "tok.json"))
    folder = tmp_path / "locks"
    folder.mkdir()
    tokenizer = _LockingTokenizer(loaded.json, loaded.info, folder=str(folder), failing=-1, quick=quick)
    with pytest.raises(IntegrityError, match="null sample_id") as raised:
        export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=tokenizer,
                            tier="ray", storage=cfs_storage(("ray", tmp_path / "ray")), file_tokens=200,
                            engine=ray_engine, workers=2)
    # ``raised`` keeps the traceback (a caller logging the error does too): the tasks must not wait for its collection
    assert_stopped(folder)
    assert raised.traceback
