"""Job leases: at most one run of a job per lake at a time, without a lock server.

A lease is a small JSON object at ``{lake}/_leases/{job}.json`` holding the owner token,
host, pid, run id and an expiry. It is created with an atomic create-if-absent (local:
``os.open(O_CREAT | O_EXCL)``; S3: conditional PUT ``If-None-Match: *``) and renewed by a
heartbeat thread with a compare-and-swap (local: under ``flock``; S3: ``If-Match`` on the
MD5 ETag of the content we read). A lease is stale when it has expired, or when its holder ran
on this host and that process is gone (a SIGKILLed run), so a crashed holder never blocks
the next run for longer than the expiry. A stale lease is taken over with the same
compare-and-swap, so of two runs that race for it exactly one wins.

The lease also holds the plan of the run in progress (run id, ``--full``, the identities of
its input files) before that run commits anything, so the run that takes over a killed
holder's lease can complete exactly that run first (``datahub.pipeline.resume``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from typing import Any

from datahub.errors import RunLockedError, StorageError
from datahub.lake.lake import Lake, fsspec_options
from datahub.retry import DEFAULT_POLICY, retry_policy, storage_errors

log = logging.getLogger(__name__)

LEASE_DIR = "_leases"
DEFAULT_TTL_S = 120.0  # a crashed run on another host blocks the next one for at most this long


@dataclass(frozen=True)
class LeaseInfo:
    """What a lease file says: who holds job ``job`` and until when."""

    job: str
    owner: str
    host: str
    pid: int
    acquired: float
    expires: float
    run_id: str | None = None
    source: str | None = None
    full: bool = False
    lake: str = ""
    # The plan of the run in progress, recorded before it commits anything:
    inputs: list[list[Any]] | None = None  # its input files: [uri, size, etag or mtime]
    run_full: bool | None = None  # whether it reprocesses everything (a resumed run's own flag, not ``full``)
    job_hash: str | None = None  # the job spec it runs (JobSpec.job_hash)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseInfo:
        raw = json.loads(data)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    def holder_gone(self) -> bool:
        """True when the holder ran on this host and its process no longer exists."""
        return self.host == socket.gethostname() and not _process_alive(self.pid)

    @property
    def left_by_failed_run(self) -> bool:
        """Left behind expired (``JobLease.release(interrupted=True)``) by a run that failed or was interrupted,
        its plan kept so the next run completes it; not a holder that stopped renewing."""
        return self.expires == 0.0

    def is_stale(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires or self.holder_gone()

    def rerun_command(self, lake: str | None = None) -> str:
        """The command that resumes the interrupted run (the re-run completes it first). ``lake``: the lake as the
        user names it (``Lake.ref``: the lake YAML with its storage options), else the root the lease recorded."""
        return rerun_command(self.job, job_spec=self.source, lake=lake or self.lake, full=self.full)

    def describe(self) -> str:
        def when(ts: float) -> str:
            return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

        run = f" (run {self.run_id})" if self.run_id else ""
        return f"held by {self.host} pid {self.pid}{run} since {when(self.acquired)}, expires {when(self.expires)} unless renewed"


def rerun_command(job: str, *, job_spec: str | None, lake: str, full: bool) -> str:
    """The command that re-runs job ``job`` (and so completes its interrupted or failed run).

    ``job_spec`` is the spec file the run was started from; a run started from Python
    (``run_job(spec)``, no file) gets the equivalent call instead of a made-up path.
    """
    if job_spec and not job_spec.startswith("<"):
        return f"datahub run {job_spec} --lake {lake}" + (" --full" if full else "")
    return (f"run_job(spec{', full=True' if full else ''}) again in Python with the spec of job {job!r} "
            f"(lake {lake}); the run was started from Python, so no job spec file was recorded")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child not yet reaped by its parent is a zombie: gone for our purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


class _LocalStore:
    """Lease files in a local (or POSIX-mounted) directory; mutations serialized by flock."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        os.makedirs(self.directory, exist_ok=True)
        with open(self.path(f".{key}.mutex"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read(self, key: str) -> bytes | None:
        try:
            with open(self.path(key), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def create(self, key: str, data: bytes) -> bool:
        with self._locked(key):
            try:
                fd = os.open(self.path(key), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            return True

    def swap(self, key: str, expected: bytes, data: bytes) -> bool:
        with self._locked(key):
            if self.read(key) != expected:
                return False
            tmp = self.path(f".{key}.{uuid.uuid4().hex}.tmp")
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path(key))
            return True

    def delete(self, key: str, expected: bytes) -> None:
        with self._locked(key):
            if self.read(key) == expected:
                os.unlink(self.path(key))

    def keys(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.endswith(".json") and not n.startswith("."))


class _ObjectStore:
    """Lease objects on S3-compatible storage (Ceph radosgw, AWS) through s3fs conditional writes."""

    def __init__(self, root: str, storage_options: dict[str, str]) -> None:
        import fsspec

        self.fs, path = fsspec.core.url_to_fs(f"{root}/{LEASE_DIR}", **fsspec_options(storage_options), skip_instance_cache=True)
        self.bucket, _, self.prefix = path.partition("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def read(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(f"{self.bucket}/{self._key(key)}")
        except FileNotFoundError:
            return None

    def create(self, key: str, data: bytes) -> bool:
        try:
            self.fs.call_s3("put_object", Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
        except OSError as exc:
            if _precondition_failed(exc):
                return False
            raise
        return True

    def swap(self, key: str, expected: bytes, data: bytes) -> bool:
        # A single-part PUT's ETag is the MD5 of its body (AWS and radosgw); Ceph wants it unquoted.
        etag = hashlib.md5(expected, usedforsecurity=False).hexdigest()
        try:
            self.fs.call_s3("put_object", Bucket=self.bucket, Key=self._key(key), Body=data, IfMatch=etag)
        except (OSError, FileNotFoundError) as exc:
            if _precondition_failed(exc) or isinstance(exc, FileNotFoundError):
                return False
            raise
        return True

    def delete(self, key: str, expected: bytes) -> None:
        # No conditional DELETE on radosgw: check, then delete (a takeover in between needs our
        # lease to be stale already, i.e. a paused holder, and costs only that lease).
        if self.read(key) == expected:
            self.fs.rm_file(f"{self.bucket}/{self._key(key)}")

    def keys(self) -> list[str]:
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        try:
            names = self.fs.ls(base, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(n.rsplit("/", 1)[-1] for n in names if n.endswith(".json"))


def _precondition_failed(error: BaseException) -> bool:
    exc: BaseException | None = error
    while exc is not None:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = response.get("Error", {}).get("Code")
            return status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict")
        exc = exc.__cause__
    return False


def _store(lake: Lake) -> _LocalStore | _ObjectStore:
    if lake.is_local:
        root = lake.root.removeprefix("file://")
        return _LocalStore(os.path.join(root, LEASE_DIR))
    if lake.root.startswith(("s3://", "s3a://")):
        return _ObjectStore(lake.root, lake.storage_options)
    raise StorageError(f"{lake.root}: job leases need a local path or s3:// lake; got scheme {lake.root.split('://')[0]!r}")


def _call(where: str, fn: Any) -> Any:
    def attempt() -> Any:
        with storage_errors(where):
            return fn()

    return retry_policy(attempt, DEFAULT_POLICY)


def read_lease(lake: Lake, job: str) -> LeaseInfo | None:
    data = _call(f"{lake.root}/{LEASE_DIR}/{job}.json", lambda: _store(lake).read(f"{job}.json"))
    return None if data is None else LeaseInfo.from_bytes(data)


def list_leases(lake: Lake) -> list[LeaseInfo]:
    """Every lease under the lake (held, or left behind by a run that died)."""
    store = _store(lake)
    out = []
    for key in _call(f"{lake.root}/{LEASE_DIR}", store.keys):
        data = _call(f"{lake.root}/{LEASE_DIR}/{key}", lambda key=key: store.read(key))
        if data is not None:
            out.append(LeaseInfo.from_bytes(data))
    return out


class JobLease:
    """The lease of one job on one lake; use as a context manager around a run.

    ``with JobLease(lake, "demo"):`` acquires (or raises ``RunLockedError``), renews every
    ``ttl_s / 4`` seconds from a daemon thread, and releases on exit; an exception leaves it behind expired
    with its plan unless ``keep_on_failure`` was cleared. A SIGKILLed holder leaves its lease behind: the next
    run takes it over (holder gone on this host, or expired).
    """

    def __init__(self, lake: Lake, job: str, *, ttl_s: float = DEFAULT_TTL_S, source: str | None = None,
                 full: bool = False) -> None:
        self.lake = lake
        self.job = job
        self.ttl_s = ttl_s
        self.key = f"{job}.json"
        self.uri = f"{lake.root}/{LEASE_DIR}/{self.key}"
        self._store = _store(lake)
        self._info = LeaseInfo(job=job, owner=uuid.uuid4().hex, host=socket.gethostname(), pid=os.getpid(),
                               acquired=0.0, expires=0.0, source=source, full=full, lake=lake.root)
        self._held: bytes | None = None  # the exact bytes we last wrote
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None
        self.took_over: LeaseInfo | None = None
        # Whether an exception leaves the lease behind (expired, plan kept) rather than deleting it. True unless the
        # holder says otherwise: ``run_job`` clears it while its run has committed nothing (nothing to complete, so
        # a clean failure frees the job) and sets it again before its first commit.
        self.keep_on_failure = True

    @property
    def info(self) -> LeaseInfo:
        return self._info

    def acquire(self) -> JobLease:
        now = time.time()
        info = replace(self._info, acquired=now, expires=now + self.ttl_s)
        data = info.to_bytes()
        if _call(self.uri, lambda: self._store.create(self.key, data)):
            self._info, self._held = info, data
            return self
        current = _call(self.uri, lambda: self._store.read(self.key))
        if current is None:  # released between our create and read: try once more
            return self.acquire()
        holder = LeaseInfo.from_bytes(current)
        if holder.run_id and holder.inputs is not None:  # a dead run's plan: ours until run_job writes its own, so a
            # death or failure before that still leaves it for the next run (not a lease without any plan)
            info = replace(info, run_id=holder.run_id, inputs=holder.inputs, run_full=holder.run_full,
                           job_hash=holder.job_hash)
            data = info.to_bytes()
        if not holder.is_stale():
            raise RunLockedError(
                f"job {self.job!r} is already running on lake {self.lake.root}: lease {self.uri} {holder.describe()}. "
                "Wait for that run to finish; if its process is gone the lease frees itself at expiry "
                f"(or delete {self.uri} once you are sure nothing runs)."
            )
        if not _call(self.uri, lambda: self._store.swap(self.key, current, data)):
            raise RunLockedError(f"job {self.job!r}: another run took over the stale lease {self.uri} first; try again later")
        if holder.left_by_failed_run:  # its expiry is 0 (1970), not a time; what resumes is run_job's to say
            when = datetime.fromtimestamp(holder.acquired, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            log.warning("took over the lease left by a failed or interrupted run of job %r (%s pid %d, started %s) "
                        "in %s", self.job, holder.host, holder.pid, when, self.uri)
        else:
            log.warning("took over stale lease %s (%s)", self.uri, holder.describe())
        self.took_over = holder
        self._info, self._held = info, data
        return self

    def update(self, **fields: Any) -> None:
        """Renew now, also recording ``fields`` (e.g. ``run_id``) in the lease."""
        with self._lock:
            self._renew_locked(**fields)

    def renew(self) -> None:
        with self._lock:
            self._renew_locked()

    def _renew_locked(self, **fields: Any) -> None:
        if self._held is None:
            raise RunLockedError(f"{self.uri}: lease is not held")
        if self.lost:
            raise RunLockedError(self.lost)
        info = replace(self._info, expires=time.time() + self.ttl_s, **fields)
        data = info.to_bytes()
        held = self._held
        if not _call(self.uri, lambda: self._store.swap(self.key, held, data)):
            self.lost = (f"job {self.job!r}: lost the lease {self.uri} (another run took it over after it expired); "
                         "this run stops before committing more; re-run the job")
            raise RunLockedError(self.lost)
        self._info, self._held = info, data

    def ensure_held(self) -> None:
        """Raise ``RunLockedError`` if the heartbeat found the lease taken over."""
        if self.lost:
            raise RunLockedError(self.lost)

    def release(self, *, interrupted: bool = False) -> None:
        """Delete the lease; ``interrupted``: leave it behind expired instead, plan included, so
        the next run takes it over at once and completes this run (as after a SIGKILL)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            if self._held is not None and not self.lost:
                held = self._held
                if interrupted:
                    expired = replace(self._info, expires=0.0).to_bytes()
                    _call(self.uri, lambda: self._store.swap(self.key, held, expired))
                else:
                    _call(self.uri, lambda: self._store.delete(self.key, held))
            self._held = None

    def _heartbeat(self) -> None:
        interval = max(0.05, self.ttl_s / 4)
        while not self._stop.wait(interval):
            try:
                self.renew()
            except RunLockedError:
                log.error("%s", self.lost)
                return
            except Exception as exc:  # noqa: BLE001 - storage down for a while: try at the next beat
                log.warning("could not renew lease %s: %s", self.uri, exc)

    def __enter__(self) -> JobLease:
        self.acquire()
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease-{self.job}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # A failure once the run may have committed leaves the lease behind, expired, with the run's plan:
        # Ctrl-C and SystemExit record no failed runs row at all, and an error's failed row may not reach the lake
        # either (storage down): the lease is then the only record of what this run had started. A failure before
        # that (``keep_on_failure`` cleared) has nothing to complete: the lease is deleted as after a success.
        self.release(interrupted=exc_type is not None and self.keep_on_failure)
