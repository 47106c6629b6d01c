"""A cluster address that nothing answers on is one line naming it and the fix, soon, not minutes of engine retries.

The CLI cases run in a subprocess: this test process holds the session's embedded Ray and Spark, which a
bad address must not touch (and ``RayEngine.start`` joins an initialized Ray without connecting anywhere).
The ports are real closed ports on 127.0.0.1 (bound to find a free one, then released): no engine is mocked.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from datahub.engines.cluster import check_ray_address, check_spark_master, split_host_port
from datahub.errors import EngineUnavailableError, MissingDependencyError
from tests.engines.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
DATAHUB = str(Path(sys.executable).parent / "datahub")
# well over the bounded check (a refused port answers at once), well under what the engines took before:
# Ray retried the GCS for 150 s and more, Spark gave up after ~65 s
HANG_GUARD_S = 50


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def _qa(tmp_path: Path, *args: str, python_prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "lake").mkdir(exist_ok=True)  # an (empty) lake: the --lake check comes before the engine's
    command = [*(python_prefix or [DATAHUB]), "qa", "--lake", str(tmp_path / "lake"), "--no-record", *args]
    try:
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{' '.join(args)}: still waiting after {HANG_GUARD_S} s; stderr so far:\n"
                             f"{(exc.stderr or b'')[-2000:]!r}") from None


def test_an_unreachable_ray_address_is_one_line_naming_it_and_the_fix(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    result = _qa(tmp_path, "--engine", "ray", "--address", address)
    lines = _error_lines(result.stderr)
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: cannot reach the Ray cluster at " + address)
    assert "connection refused" in lines[0] and "ray status" in lines[0] and "ray start --head --port" in lines[0]


def test_a_ray_client_address_without_ray_client_names_the_extra(tmp_path):
    # ray[client]'s grpc hidden from this interpreter, installed or not: the path a plain `pip install ray` takes
    hide_grpc = [sys.executable, "-c", "import sys; sys.modules['grpc'] = None; sys.argv[0] = 'datahub'; "
                 "from datahub.cli.main import main; main()"]
    result = _qa(tmp_path, "--engine", "ray", "--address", f"ray://127.0.0.1:{free_port()}", python_prefix=hide_grpc)
    lines = _error_lines(result.stderr)
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "pip install 'ray[client]'" in lines[0] and "ray://127.0.0.1:" in lines[0]


def test_an_unreachable_spark_master_is_one_line_naming_it_and_the_fix(tmp_path):
    master = f"spark://127.0.0.1:{free_port()}"
    result = _qa(tmp_path, "--engine", "spark", "--address", master)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in _error_lines(result.stderr) if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: cannot reach the Spark master {master}")
    assert "connection refused" in errors[0] and "start-master.sh" in errors[0]
    assert "Py4J" not in result.stderr and "at org.apache" not in result.stderr and "Traceback" not in result.stderr


def test_a_listening_port_passes_and_a_standby_master_list_needs_one_that_answers():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_ray_address(f"127.0.0.1:{port}")
        check_spark_master(f"spark://127.0.0.1:{port}")
        check_spark_master(f"spark://127.0.0.1:{free_port()},127.0.0.1:{port}")
    with pytest.raises(EngineUnavailableError, match="connection refused; connection refused"):
        check_spark_master(f"spark://127.0.0.1:{free_port()},127.0.0.1:{free_port()}")


def test_addresses_the_engines_resolve_themselves_are_left_to_them():
    for master in (None, "local[2]", "yarn", "k8s://https://127.0.0.1:1"):
        check_spark_master(master)
    check_ray_address("auto")
    check_ray_address("local")
    assert split_host_port("head", 6379) == ("head", 6379)
    assert split_host_port("[::1]:7077", 1) == ("::1", 7077)
    assert split_host_port("head:notaport", 1) is None


def test_an_unknown_host_is_named():
    with pytest.raises(EngineUnavailableError, match="host 'no-such-head.invalid' not found"):
        check_ray_address("no-such-head.invalid:6379")


def test_a_ray_client_check_is_a_missing_dependency_when_grpc_is_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'ray\[client\]'"):
        check_ray_address("ray://head:10001")


def test_a_port_that_answers_http1_is_refused_as_not_a_ray_gcs():
    # e.g. the Ray dashboard (8265) or an S3 gateway given as engine.address: Ray's GCS client retried it for
    # minutes ("Failed to connect to GCS ... within 5 seconds", again and again) before this check
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        with pytest.raises(EngineUnavailableError) as raised:
            check_ray_address(address)
        message = str(raised.value)
        assert f"Ray address {address} is not a Ray GCS" in message and "not answer as a gRPC server" in message
        assert "ray status" in message and "6379" in message and "engine.address" in message
    finally:
        server.shutdown()
        server.server_close()


def test_a_real_ray_gcs_passes_the_check(ray_engine):
    import ray

    gcs_address = ray.get_runtime_context().gcs_address
    check_ray_address(gcs_address)  # a gRPC (HTTP/2) server: its reply is no HTTP/1 status line


def test_a_spark_master_port_that_is_not_a_master_is_one_error_line_not_a_traceback(tmp_path):
    # Spark retries a listening non-master for about a minute, then pyspark raised a Py4JJavaError ("Cannot call
    # methods on a stopped SparkContext") that the CLI printed as a Python traceback, exit 1
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    master = f"spark://127.0.0.1:{server.server_address[1]}"
    (tmp_path / "lake").mkdir()
    command = [DATAHUB, "qa", "--lake", str(tmp_path / "lake"), "--no-record", "--engine", "spark", "--address", master]
    try:
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in _error_lines(result.stderr) if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: the Spark master {master} did not take"), errors
    assert "engine.master" in errors[0]


def test_an_http_ray_address_names_the_gcs_address_instead():
    # Ray refuses http(s):// (the dashboard / job API) with a ValueError about RAY_ADDRESS: a traceback, exit 1
    for address in ("http://127.0.0.1:8265", "https://head:8265"):
        with pytest.raises(EngineUnavailableError) as raised:
            check_ray_address(address)
        message = str(raised.value)
        assert f"Ray address {address}" in message and "dashboard" in message
        assert "6379" in message and "engine.address" in message
