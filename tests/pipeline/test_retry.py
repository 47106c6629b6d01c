"""retry() retries transient errors only, with backoff; storage failures map to StorageError."""

from __future__ import annotations

import logging
import socket

import pyarrow as pa
import pytest

from datahub.config.spec import InputSpec
from datahub.errors import CommitConflictError, SpecError, StorageError
from datahub.lake import Lake
from datahub.lake.lake import fsspec_options
from datahub.pipeline.ingest import IngestFiles
from datahub.pipeline.inputs import list_input_files
from datahub.retry import RetryPolicy, is_transient_storage_error, retry, retry_stream, storage_errors
from operators.ingest.base import InputFile


def test_retries_transient_until_success_with_growing_backoff():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise CommitConflictError("someone else committed")
        return "ok"

    assert retry(flaky, attempts=5, backoff=0.1, jitter=0, sleep=sleeps.append) == "ok"
    assert len(calls) == 4 and sleeps == pytest.approx([0.1, 0.2, 0.4])


def test_terminal_and_unknown_errors_are_not_retried():
    calls = []

    def bad():
        calls.append(1)
        raise SpecError("bad spec")

    with pytest.raises(SpecError):
        retry(bad, attempts=5, backoff=0, sleep=lambda s: None)
    with pytest.raises(KeyError):
        retry(lambda: {}["x"], attempts=5, backoff=0, sleep=lambda s: None)
    assert calls == [1]


def test_gives_up_after_attempts():
    calls = []

    def down():
        calls.append(1)
        raise StorageError("down")

    with pytest.raises(StorageError):
        retry(down, attempts=3, backoff=0, sleep=lambda s: None)
    assert len(calls) == 3


def test_classification_of_storage_errors():
    assert is_transient_storage_error(ConnectionRefusedError(111, "refused"))
    assert is_transient_storage_error(socket.timeout("timed out"))
    assert is_transient_storage_error(OSError("Generic S3 error: error sending request: tcp connect error: Connection refused (os error 111)"))
    assert not is_transient_storage_error(FileNotFoundError("no such key"))
    assert not is_transient_storage_error(OSError("Generic S3 error: Client error with status 403 Forbidden"))
    assert not is_transient_storage_error(ValueError("schema mismatch"))
    from deltalake.exceptions import CommitFailedError, DeltaError

    # what write_deltalake raised when radosgw stayed down longer than object_store's own retries (seen in CI)
    assert is_transient_storage_error(DeltaError(
        "Failed to parse parquet: External: Generic S3 error: Error performing PUT http://127.0.0.1:7480/b/x.parquet "
        "in 5.5s, after 10 retries, max_retries: 10, retry_timeout: 180s  - HTTP error: error sending request"))
    assert not is_transient_storage_error(DeltaError("Schema error: Invalid data type for Delta Lake: Null"))
    assert not is_transient_storage_error(CommitFailedError("Transaction failed: version already exists"))

    class ClientError(Exception):
        def __init__(self, status):
            self.response = {"ResponseMetadata": {"HTTPStatusCode": status}}

    assert is_transient_storage_error(ClientError(503)) and not is_transient_storage_error(ClientError(404))
    with pytest.raises(StorageError, match="read x: storage did not answer"):
        with storage_errors("read x"):
            raise ConnectionResetError(104, "reset by peer")
    with pytest.raises(ValueError):
        with storage_errors("read x"):
            raise ValueError("not storage")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lake_on_an_unreachable_endpoint_raises_storage_error_after_retrying():
    options = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}", "AWS_ACCESS_KEY_ID": "k",
               "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    lake = Lake("s3://nobucket/lake", storage_options=options, retry=RetryPolicy(attempts=2, backoff=0.01))
    with pytest.raises(StorageError, match="read s3://nobucket/lake/runs") as error:
        lake.read("runs")
    assert isinstance(error.value.__cause__, OSError)
    with pytest.raises(StorageError, match="commit t1 to s3://nobucket/lake/x"):
        lake.commit("x", pa.table({"a": [1]}), txn="t1")


def test_retry_stream_restarts_and_skips_what_was_yielded():
    breaks = [3, 3, 7]  # where successive tries of the stream break; the fourth runs through

    def start():
        stop = breaks.pop(0) if breaks else None

        def items():
            for i in range(10):
                if i == stop:
                    raise StorageError(f"connection reset at item {i}")
                yield i

        return items()

    sleeps = []
    out = list(retry_stream(start, RetryPolicy(attempts=3, backoff=0.1, jitter=0), where="read x", sleep=sleeps.append))
    assert out == list(range(10))  # each item exactly once
    # try 2 got no further than try 1 (second failure in a row); try 3 got further, so the count starts again
    assert sleeps == pytest.approx([0.1, 0.2, 0.1])


def test_retry_stream_gives_up_after_attempts_without_progress():
    tries = []

    def start():
        tries.append(1)
        raise StorageError("refused")

    with pytest.raises(StorageError):
        list(retry_stream(start, RetryPolicy(attempts=3, backoff=0), where="read x", sleep=lambda s: None))
    assert len(tries) == 3


def _unreachable_s3_options() -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}", "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}


def test_ingest_retries_a_file_whose_storage_fails_then_raises(caplog, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries off: the failures reach datahub
    options = fsspec_options(_unreachable_s3_options())
    file = InputFile(uri="s3://bucket/docs.jsonl", size=10, etag="abc", mtime="", format="jsonl",
                     storage_options=tuple(sorted(options.items())))
    ingest = IngestFiles(run_id="r1", max_record_bytes=1000, min_text_chars=1, batch_rows=10,
                         retry=RetryPolicy(attempts=3, backoff=0.01))
    with caplog.at_level(logging.WARNING, logger="datahub.retry"):
        with pytest.raises(StorageError, match="s3://bucket/docs.jsonl: storage did not answer"):
            list(ingest(file))  # never a quarantine row: the storage failure is raised, the file is not "ingested"
    retries = [r.getMessage() for r in caplog.records if "read s3://bucket/docs.jsonl: try" in r.getMessage()]
    assert len(retries) == 2 and "try 1/3 failed" in retries[0] and "try 2/3 failed" in retries[1]


def test_listing_inputs_retries_storage_errors_instead_of_matching_no_file(caplog, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    spec = InputSpec(uri="s3://bucket/in/*.jsonl", storage_options=_unreachable_s3_options())
    with caplog.at_level(logging.WARNING, logger="datahub.retry"):
        with pytest.raises(StorageError, match=r"list s3://bucket/in/\*\.jsonl: storage did not answer"):
            list_input_files([spec], source="job.yaml", retry=RetryPolicy(attempts=2, backoff=0.01))
    assert any("attempt 1/2 failed" in r.getMessage() for r in caplog.records)


def test_a_commit_with_a_schema_merge_is_retried_once_per_attempt_not_squared(tmp_path, monkeypatch):
    """commit_files retries its whole attempt; the schema-merge commit inside it does not retry again."""
    from datahub.lake.add_actions import commit_files

    lake = Lake(tmp_path / "lake", retry=RetryPolicy(attempts=3, backoff=0, jitter=0))
    lake.commit("t", pa.table({"a": [1]}), txn="t0")
    calls = []

    def outage(*args, **kwargs):
        calls.append(kwargs["txn"])
        raise ConnectionError("connection reset by peer")

    monkeypatch.setattr(Lake, "_commit_once", outage)
    with pytest.raises(StorageError, match="commit t1"):
        commit_files(lake, "t", [], schema=pa.schema([("a", pa.int64()), ("b", pa.string())]), txn="t1")
    assert calls == ["t1/schema"] * 3  # 3 attempts, not 3 x 3
