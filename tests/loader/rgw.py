"""A private radosgw on its own port, for tests that kill (SIGKILL) or freeze (SIGSTOP) the S3 endpoint.

It joins the cluster that .ci/ceph.sh runs with its own cephx key, so it serves the same buckets and objects
as the shared endpoint (port 7480), which other tests keep using undisturbed while this one is killed or
frozen. Starting one takes well under a second here. The fixture always thaws and stops it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ceph import S3Endpoint, _state_dir, ceph_s3  # noqa: F401

NAME = "client.rgw.loaderfault"
START_TIMEOUT_S = 60.0
# Keep a killed or frozen instance from stalling the shared radosgw. Every radosgw watches the zone's control
# objects (notify.0-7) and a metadata write (e.g. CreateBucket) notifies the watchers of one of them and waits
# for their acks: a SIGKILLed watcher is dropped only after the OSD's 30 s watch timeout and a SIGSTOPped one
# does not ack until thawed, so the shared endpoint's CreateBucket took ~29 s during this test's outages
# (measured). With one control object this instance watches notify.0 only (1 in 8 notifies reach it), and
# ``kill`` blocklists its RADOS client at once, so the OSD drops the dead watch; a freeze is kept to seconds.
# Its cache is off (so it needs no notifies to stay coherent) and so are its background threads (gc,
# lifecycle, quota, resharding), whose RADOS locks a killed process would hold until they expire.
ISOLATION = ("--rgw-num-control-oids=1", "--rgw-cache-enabled=false", "--rgw-enable-gc-threads=false",
             "--rgw-enable-lc-threads=false", "--rgw-enable-quota-threads=false", "--rgw-dynamic-resharding=false")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateRgw:
    """One radosgw process of this test's own: ``kill``, ``freeze``, ``thaw`` and ``start`` it at will."""

    def __init__(self, workdir: Path, shared: S3Endpoint, conf: Path) -> None:
        self.workdir = workdir
        self.conf = conf
        self.port = _free_port()
        self.endpoint = S3Endpoint(f"http://127.0.0.1:{self.port}", shared.key, shared.secret, shared.region)
        self.process: subprocess.Popen[bytes] | None = None
        self.watchers: set[str] = set()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.keyring = self.workdir / "keyring"

    def _ceph(self, *args: str, tool: str = "ceph") -> str:
        command = [tool, "-c", str(self.conf), *(["--connect-timeout", "15"] if tool == "ceph" else []), *args]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=60).stdout

    def _control_watchers(self, oid: str) -> set[str]:
        """RADOS client addresses watching a control object of the default zone."""
        out = self._ceph("-p", "default.rgw.control", "listwatchers", oid, tool="rados")
        return {part.split("=", 1)[1] for part in out.split() if part.startswith("watcher=")}

    def _own_watchers(self) -> set[str]:
        """This instance's watch clients: on notify.0 but not notify.1 (every 8-object radosgw watches both)."""
        deadline = time.monotonic() + 15
        while True:
            own = self._control_watchers("notify.0") - self._control_watchers("notify.1")
            if own or time.monotonic() > deadline:
                return own
            time.sleep(0.2)

    def _make_key(self) -> None:
        # get-or-create is idempotent: every test run reuses the same cephx identity
        subprocess.run(["ceph", "-c", str(self.conf), "--connect-timeout", "15", "auth", "get-or-create", NAME,
                        "mon", "allow rw", "osd", "allow rwx", "mgr", "allow rw", "-o", str(self.keyring)],
                       check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        """Start radosgw (again, after ``kill``) on the same port and return once it answers."""
        if not self.keyring.exists():
            self._make_key()
        log = open(self.workdir / "radosgw.out", "ab")  # noqa: SIM115 - the child keeps the descriptor
        with log:
            self.process = subprocess.Popen(
                ["radosgw", "-f", "-c", str(self.conf), "-n", NAME, "--keyring", str(self.keyring),
                 "--rgw-frontends", f"beast endpoint=127.0.0.1:{self.port}",
                 "--pid-file", str(self.workdir / "radosgw.pid"), "--admin-socket", str(self.workdir / "radosgw.asok"),
                 "--log-file", str(self.workdir / "radosgw.log"), "--rgw-data", str(self.workdir / "data"),
                 *ISOLATION],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"radosgw exited {self.process.returncode}; see {self.workdir}/radosgw.out")
            if time.monotonic() > deadline:
                raise RuntimeError(f"radosgw did not answer on {self.endpoint.endpoint_url} in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
        self.watchers = self._own_watchers()

    def answers(self) -> bool:
        """True when radosgw answers an HTTP request (a TCP connect alone also succeeds when it is frozen)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as conn:
                conn.settimeout(1.0)
                conn.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                return conn.recv(12).startswith(b"HTTP/1.1")
        except OSError:
            return False

    def _signal(self, signum: int) -> None:
        assert self.process is not None and self.process.poll() is None, "radosgw is not running"
        os.kill(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL, as a crashed radosgw: connections are refused until ``start``."""
        self._signal(signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=30)
        for address in self.watchers:  # the OSD drops the dead process's watch now, not after 30 s
            self._ceph("osd", "blocklist", "add", address, "600")
        self.watchers = set()

    def freeze(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, but no request is ever answered."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """Thaw and terminate, whatever state the test left it in."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)

    def s3fs_kwargs(self) -> dict[str, Any]:
        return self.endpoint.s3fs_kwargs()


@pytest.fixture
def private_rgw(tmp_path: Path, ceph_s3: S3Endpoint) -> Iterator[PrivateRgw]:  # noqa: F811
    """A radosgw of this test's own on the shared cluster; skipped (failed under CI) without .ci/ceph.sh's config."""
    conf = _state_dir() / "ceph.conf"
    if not conf.exists():
        message = f"no {conf}: a private radosgw needs the cluster that .ci/ceph.sh starts"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    rgw = PrivateRgw(tmp_path / "radosgw", ceph_s3, conf)
    try:
        rgw.start()
        yield rgw
    finally:
        rgw.stop()
