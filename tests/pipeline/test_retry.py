"""retry() retries transient errors only, with backoff; storage failures map to StorageError."""

from __future__ import annotations

import socket

import pyarrow as pa
import pytest

from datahub.errors import CommitConflictError, SpecError, StorageError
from datahub.lake import Lake
from datahub.retry import RetryPolicy, is_transient_storage_error, retry, storage_errors


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
