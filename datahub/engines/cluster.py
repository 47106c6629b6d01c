"""Reaching the cluster an engine is given (a Ray GCS or Ray Client address, a Spark standalone master) before the
engine's own client tries: a TCP connect with a bound, so a wrong or stopped address is one line naming it in
seconds instead of Ray's minutes of GCS retries or Spark's minute of Java stack traces.

A Ray address is also sent the HTTP/2 preface its gRPC server takes: a port that answers with something other
than an HTTP/2 frame or a TLS record (the Ray dashboard, an S3 gateway: HTTP/1) is refused, since Ray's GCS
client retries it for minutes. Silence or a closed connection is left to the engine.
"""

from __future__ import annotations

import importlib
import socket
from urllib.parse import urlsplit

from datahub.errors import EngineUnavailableError, MissingDependencyError

# A refused port answers at once; an address that drops packets (a firewall, a stopped VM) waits this long.
CONNECT_TIMEOUT_S = 10.0

RAY_GCS_PORT = 6379  # `ray start --head` default
RAY_CLIENT_PORT = 10001  # Ray Client server default (ray://)
SPARK_MASTER_PORT = 7077  # standalone master default
RAY_DASHBOARD_PORT = 8265  # the dashboard's HTTP port: the address users copy by mistake
# how long a listening port may take to answer the HTTP/2 preface; silence is left to the engine
REPLY_TIMEOUT_S = 2.0
# RFC 9113 section 3.4: the client connection preface, then an empty SETTINGS frame
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def split_host_port(hostport: str, default_port: int) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``, or a bare host with ``default_port``) as a pair; None if it is not one."""
    try:
        parts = urlsplit(f"//{hostport}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname, default_port if port is None else port


def _connect_error(host: str, port: int, timeout_s: float) -> str | None:
    """Why a TCP connection to ``host:port`` fails within ``timeout_s``; None when it connects."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as exc:
        return f"host {host!r} not found ({exc.strerror})"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()


def _not_grpc_answer(host: str, port: int, timeout_s: float) -> str | None:
    """The start of what ``host:port`` answers to the HTTP/2 preface when it is neither an HTTP/2 frame (a gRPC
    server sends SETTINGS first, RFC 9113 section 3.4) nor a TLS record; None for those, silence or an error."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.sendall(HTTP2_PREFACE)
            reply = connection.recv(256)
    except OSError:  # TimeoutError included
        return None
    if not reply:
        return None
    if len(reply) >= 9 and reply[3] == 0x04:  # an HTTP/2 frame header of type SETTINGS
        return None
    if reply[0] in (0x14, 0x15, 0x16, 0x17) and reply[1:2] == b"\x03":  # a TLS record (a TLS-wrapped GCS)
        return None
    return reply.split(b"\n", 1)[0].strip().decode("latin-1")[:80]


def check_ray_address(address: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse a Ray cluster address that cannot be reached: ``host:port`` of the head's GCS, or ``ray://host:port``
    of its Ray Client server (which needs ``ray[client]``). ``auto`` and ``local`` are Ray's to resolve."""
    if address in ("auto", "local"):
        return
    client = address.startswith("ray://")
    if client:
        try:
            importlib.import_module("grpc")  # what Ray Client needs and `pip install ray` leaves out
        except ImportError:
            raise MissingDependencyError(
                f"Ray address {address}: a ray:// address connects through the Ray Client, which needs "
                "`pip install 'ray[client]'`; or, on a machine inside the cluster, give the head's GCS address "
                f"(host:{RAY_GCS_PORT}, no ray://)") from None
    elif address.startswith(("http://", "https://")):  # ray.init raised a ValueError about RAY_ADDRESS: a traceback
        raise EngineUnavailableError(
            f"the Ray address {address} is an HTTP address (the Ray dashboard or job API, port {RAY_DASHBOARD_PORT}), "
            f"which ray.init does not take; give the head's GCS address host:port (`ray status` on the head node "
            f"prints it; port {RAY_GCS_PORT} by default) or ray://host:{RAY_CLIENT_PORT}; --address / engine.address")
    elif "://" in address:  # another scheme (a Ray client builder module): Ray's own error says what it takes
        return
    where = split_host_port(address.removeprefix("ray://"), RAY_CLIENT_PORT if client else RAY_GCS_PORT)
    if where is None:
        return
    host, port = where
    why = _connect_error(host, port, timeout_s)
    if why is None:
        answer = _not_grpc_answer(host, port, min(timeout_s, REPLY_TIMEOUT_S))
        if answer is not None:
            server = "Ray Client server" if client else "Ray GCS"
            raise EngineUnavailableError(
                f"the Ray address {address} is not a {server}: that port does not answer as a gRPC server (it "
                f"answered {answer!r}, as a web server or the Ray dashboard, port {RAY_DASHBOARD_PORT}, does); "
                "give the head's "
                + (f"Ray Client address (ray://host:{RAY_CLIENT_PORT})" if client
                   else f"GCS address (`ray status` on the head node prints it; port {RAY_GCS_PORT} by default)")
                + "; --address / engine.address")
        return
    start = (f"`ray start --head --ray-client-server-port {port}`" if client
             else f"`ray start --head --port {port}`")
    raise EngineUnavailableError(
        f"cannot reach the Ray cluster at {address} ({why}); check the address (`ray status` on the head node "
        f"prints it) or start the cluster there ({start}); --address / engine.address")


def check_spark_master(master: str | None, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse a ``spark://`` standalone master none of whose hosts can be reached (``spark://h1:7077,h2:7077`` is
    a standby list: one answering is enough). Other masters (local, yarn, k8s://) are Spark's to resolve."""
    if master is None or not master.startswith("spark://"):
        return
    reasons = []
    for hostport in master.removeprefix("spark://").split(","):
        where = split_host_port(hostport, SPARK_MASTER_PORT)
        if where is None:
            return  # not host:port: Spark's own error names what it takes
        why = _connect_error(*where, timeout_s)
        if why is None:
            return
        reasons.append(why)
    raise EngineUnavailableError(
        f"cannot reach the Spark master {master} ({'; '.join(reasons)}); check the master URL (the master's web UI, "
        "port 8080, shows it) or start the master there (`$SPARK_HOME/sbin/start-master.sh`); "
        "--address / engine.master / spark.master / SPARK_MASTER")
