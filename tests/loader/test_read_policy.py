"""The loader's classification of replica read errors and its read policy (timeouts handed to the transport)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError

from datahub.errors import SpecError, TerminalError, TransientError
from datahub.loader import ReadPolicy
from datahub.loader.errors import ReplicaUnavailableError, ReplicaUnusableError, replica_error


def _client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetObject")


@pytest.mark.parametrize("error", [
    EndpointConnectionError(endpoint_url="http://127.0.0.1:7480/b/k"),
    ReadTimeoutError(endpoint_url="http://127.0.0.1:7480/b/k"),
    _client_error(503, "ServiceUnavailable"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError(),
])
def test_transport_failures_are_transient(error: Exception) -> None:
    classified = replica_error(error)
    assert isinstance(classified, ReplicaUnavailableError) and isinstance(classified, TransientError)
    assert type(error).__name__ in str(classified)


@pytest.mark.parametrize("error", [
    FileNotFoundError(2, "No such file or directory"),
    PermissionError(13, "Permission denied"),
    NoCredentialsError(),
    _client_error(400, "InvalidArgument"),
    ValueError("bad url"),
])
def test_replica_problems_are_terminal_for_that_replica(error: Exception) -> None:
    classified = replica_error(error)
    assert isinstance(classified, ReplicaUnusableError) and isinstance(classified, TerminalError)


def test_other_errors_are_bugs_and_not_swallowed() -> None:
    assert replica_error(TypeError("unsupported operand")) is None
    assert replica_error(KeyError("x")) is None


def test_s3_options_carry_timeouts_and_no_transport_retries() -> None:
    policy = ReadPolicy(connect_timeout_s=2, read_timeout_s=3)
    options = policy.fsspec_options("s3://bucket/release/shard.tar", {"key": "k", "config_kwargs": {"read_timeout": 9}})
    assert options["config_kwargs"] == {"connect_timeout": 2, "read_timeout": 9, "retries": {"total_max_attempts": 1}}
    assert options["key"] == "k" and options["skip_instance_cache"] is True
    assert policy.fsspec_options("memory://bucket/x", {"a": 1}) == {"a": 1}


def test_worst_case_bounds_rounds_timeouts_and_backoff() -> None:
    policy = ReadPolicy(connect_timeout_s=1, read_timeout_s=2, attempts=3, backoff_s=1, max_backoff_s=10, jitter=0)
    assert policy.worst_case_s(tiers=1) == 3 * 2 * 3 + (1 + 2)


@pytest.mark.parametrize("field,value", [("read_timeout_s", 0), ("attempts", 0), ("tier_cooldown_s", -1), ("jitter", 1)])
def test_invalid_policy_names_the_field(field: str, value: float) -> None:
    with pytest.raises(SpecError, match=rf"ReadPolicy.{field}: must be"):
        ReadPolicy(**{field: value})
