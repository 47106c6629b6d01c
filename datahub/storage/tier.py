"""One storage tier: URIs for an export directory, atomic publish, checksummed reads, deletes.

Publishing is atomic on every kind: cfs writes a temp file then ``os.replace``; ceph is one
S3 PUT (an object appears whole or not at all); hdfs writes a temp file then WebHDFS RENAME
with ``renameoptions=OVERWRITE`` (the NameNode's rename2: an existing file is replaced in one
step, so readers never see the path missing).
Credentials are resolved here, kept in the filesystem object only, and never returned in
URIs, manifests or ``repr``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import hashlib
import logging
import mmap
import os
import re
import sys
import threading
import time
import uuid
from pathlib import Path
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from datahub.errors import DatahubError, IntegrityError, SpecError, StorageError
from datahub.retry import is_transient_storage_error
from datahub.storage.tier_spec import CephTier, CfsTier, HdfsTier
from datahub.storage.webhdfs import bound_requests

if TYPE_CHECKING:
    from datahub.storage.bandwidth import BandwidthCap
    from datahub.storage.config import StorageConfig

log = logging.getLogger("datahub.storage")

_CHUNK = 8 * 1024 * 1024
# cfs files are written 64 KiB per write(): one large write makes the page cache take large folios, which on a VM
# that reports free memory to its host are mostly pages the host must fault back in; small ones reuse the pages just
# freed (a local export frees its spill as it writes shards). L of benchmarks/release_scale.py, 2.5 GB of 32 MB
# shards: the export's shard writes 6.4 -> 4.8 s, write phase 6.3 -> 4.6 s
_WRITE_PIECE = 64 * 1024
# and every 4 MiB written, their writeback is started (sync_file_range), so the fsync that ends a publish waits for the
# last few MiB instead of the whole object. L of release_scale (77 shards of 32 MB, 2 upload threads, load 2.3-3.5):
# fsync 1.65-1.92 -> 0.92-0.93 s of the upload threads, write phase 3.1 -> 2.65-2.8 s
_WRITEBACK_PIECE = 4 * 2**20
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h
# A cfs object of at least _DIRECT_MIN bytes is written with O_DIRECT (the tier's ``direct_io``): from the caller's
# memory to the device, without the copy into the page cache that was the largest single CPU item of a local export
# on a 2-core VM (issue 16: 1.3-2.4 CPU-s of ~8.5 for 2.5 GB of 32 MB shards, copy_folio_from_iter_atomic). 40 x 32 MB
# files, fsync each, ext4: buffered 64 KiB writes 0.37-0.39 s sys; O_DIRECT 4 MiB writes from page-aligned memory
# 0.07-0.08 s sys, through an aligned bounce buffer 0.04-0.09 s sys + 0.09 s user (1 MiB pieces 0.13 s sys, 64 KiB
# 0.52 s). Smaller objects (journal entries, manifests) stay buffered: nothing to gain there.
_DIRECT_MIN = 2**20
_DIRECT_PIECE = 4 * 2**20
# a direct write's file offset, length and source address are multiples of a page (logical block sizes are 512 or
# 4096 bytes); the file's tail past the last multiple is written buffered
_DIRECT_ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux; elsewhere every write is buffered


def _answers(action: str) -> Any:
    """Decorate a ``Tier`` method taking a URI first: a failure of the tier's endpoint (connection refused, timeout,
    HTTP 5xx: ``is_transient_storage_error``), which s3fs and requests raise as botocore/aiohttp/requests errors after
    their own retries, becomes a ``StorageError`` naming the tier, the endpoint and what to check (``Tier.no_answer``).
    ``StorageError`` is transient: whoever retried the raw error by class still retries it."""
    def decorate(method: Any) -> Any:
        @functools.wraps(method)
        def call(self: Tier, uri: str, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, uri, *args, **kwargs)
            except Exception as exc:
                failure = self.no_answer(action, uri, exc)
                if failure is None:
                    raise
                raise failure from (exc.__cause__ if isinstance(exc, StorageError) else exc)
        return call
    return decorate


class Tier:
    """A configured tier by name; filesystems are created lazily and reused."""

    def __init__(self, name: str, spec: CfsTier | CephTier | HdfsTier, *, source: str = "<storage>") -> None:
        self.name = name
        self.spec = spec
        self.source = source
        self._fs: Any = None

    @classmethod
    def from_config(cls, config: StorageConfig, name: str) -> Tier:
        """The tier ``name`` of a validated storage config; an unknown name is an error naming the configured ones."""
        if name not in config.tiers:
            raise SpecError(f"{config.source}: tiers.{name}: no such tier; configured tiers: {sorted(config.tiers)}")
        return cls(name, config.tiers[name], source=config.source)

    def __repr__(self) -> str:  # never the credentials
        return f"Tier({self.name!r}, kind={self.kind!r}, root={self.root_uri!r})"

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def region(self) -> str | None:
        """The tier's region label (``region:`` in the storage YAML), or None."""
        return self.spec.region

    @property
    def root_uri(self) -> str:
        spec = self.spec
        if isinstance(spec, CfsTier):
            return spec.path.rstrip("/") or "/"
        if isinstance(spec, CephTier):
            return f"s3://{spec.bucket}" + (f"/{spec.prefix.strip('/')}" if spec.prefix.strip("/") else "")
        return spec.url

    def uri(self, *parts: str) -> str:
        """The URI (a plain path on cfs) of ``parts`` under the tier root, as written into manifests."""
        return "/".join([self.root_uri.rstrip("/"), *(p.strip("/") for p in parts)])

    # --- filesystem ----------------------------------------------------------------------------------------

    def reader_options(self) -> dict[str, Any]:
        """fsspec options a reader (the loader) needs besides the URI; includes credentials, so do not log it."""
        spec = self.spec
        if isinstance(spec, CephTier):
            key, secret = self._s3_credentials(spec)
            return {"key": key, "secret": secret,
                    "client_kwargs": {"endpoint_url": spec.endpoint_url,
                                      "region_name": spec.s3_region or spec.region or "us-east-1"}}
        if isinstance(spec, HdfsTier):
            return {"user": spec.user} if spec.user else {}
        return {}

    def filesystem(self) -> Any:
        if self._fs is None:
            import fsspec

            if isinstance(self.spec, CfsTier):
                self._fs = fsspec.filesystem("file")
            elif isinstance(self.spec, CephTier):
                self._fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.reader_options())
            else:
                from fsspec.utils import infer_storage_options

                where = infer_storage_options(self.spec.url)
                self._fs = bound_requests(
                    fsspec.filesystem("webhdfs", host=where["host"], port=where["port"], skip_instance_cache=True,
                                      **self.reader_options()),
                    connect_timeout_s=self.spec.connect_timeout_s, read_timeout_s=self.spec.read_timeout_s)
        return self._fs

    def _path(self, uri: str) -> str:
        """The filesystem path of a URI of this tier (what fsspec methods take)."""
        if isinstance(self.spec, CfsTier):
            return uri
        if isinstance(self.spec, CephTier):
            return uri[len("s3://"):]
        from fsspec.utils import infer_storage_options

        return str(infer_storage_options(uri)["path"])

    def _s3_credentials(self, spec: CephTier) -> tuple[str, str]:
        creds = spec.credentials
        where = f"{self.source}: tiers.{self.name}.credentials"
        if creds.file:
            values = _read_credentials_file(Path(os.path.expanduser(creds.file)), where=where)
            key = values.get("access_key_id") or values.get("aws_access_key_id")
            secret = values.get("secret_access_key") or values.get("aws_secret_access_key")
            if not key or not secret:
                raise SpecError(f"{where}.file: {creds.file} needs access_key_id and secret_access_key entries")
            return key, secret
        key, secret = os.environ.get(creds.key_env), os.environ.get(creds.secret_env)
        if not key or not secret:
            raise SpecError(f"{where}: set the environment variables {creds.key_env} and {creds.secret_env} "
                            "or give credentials.file")
        return key, secret

    # --- operations ----------------------------------------------------------------------------------------

    def no_answer(self, action: str, uri: str, error: BaseException) -> StorageError | None:
        """The error to raise for ``error`` when this tier's endpoint failed ``action`` on ``uri`` (refused, timed out,
        answered 5xx): it names the tier, the endpoint and the fix. None for anything else (a missing object, a
        refused permission, a bug), and for cfs (a path: its OSErrors say which). A ``StorageError`` the method raised
        itself is replaced only when its cause is such a failure and it does not say so already."""
        spec = self.spec
        if isinstance(spec, CfsTier) or isinstance(error, FileNotFoundError):
            return None
        if isinstance(error, StorageError):
            if " did not answer" in str(error) or error.__cause__ is None:
                return None
            error = error.__cause__
        elif isinstance(error, DatahubError):
            return None
        if not is_transient_storage_error(error):
            return None
        if isinstance(spec, CephTier):
            endpoint, service, field = spec.endpoint_url, "the RGW (radosgw) or S3 service is up", "endpoint_url"
        else:
            endpoint, service, field = spec.url, "the NameNode (WebHDFS) and its DataNodes are up", "url"
        text = str(error).strip()
        why = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
        config = "the storage config" if self.source.startswith("<") else self.source
        return StorageError(f"tier {self.name}: cannot {action} {uri}: {endpoint} did not answer ({why}); check that "
                            f"{service} and this machine can reach it, or fix tiers.{self.name}.{field} in "
                            f"{config}; retrying may succeed once it answers")

    @_answers("stat")
    def size(self, uri: str) -> int | None:
        """Size in bytes, or None when the object does not exist."""
        try:
            if isinstance(self.spec, CfsTier):
                return os.stat(uri).st_size
            if isinstance(self.spec, CephTier):  # s3fs answers from a cached listing: a write since then is missed
                self.filesystem().invalidate_cache(self._path(uri))
            info = self.filesystem().info(self._path(uri))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot stat {uri}: {exc}") from exc
        return int(info["size"]) if info.get("type", "file") != "directory" else None

    @_answers("read")
    def read(self, uri: str) -> bytes:
        try:
            if isinstance(self.spec, CfsTier):
                return Path(uri).read_bytes()
            return bytes(self.filesystem().cat_file(self._path(uri)))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot read {uri}: {exc}") from exc

    @_answers("read")
    def read_range(self, uri: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object: one ranged read (a seek on cfs, an HTTP range on ceph and hdfs)."""
        try:
            if isinstance(self.spec, CfsTier):
                with open(uri, "rb") as handle:
                    handle.seek(start)
                    return handle.read(max(0, end - start))
            return bytes(self.filesystem().cat_file(self._path(uri), start=start, end=end))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot read {uri} [{start}, {end}): {exc}") from exc

    def chunks(self, uri: str) -> Iterator[bytes]:
        """The object's bytes in order, ``_CHUNK`` (8 MiB) at a time: one chunk held, whatever its size."""
        try:
            if isinstance(self.spec, CfsTier):
                with open(uri, "rb") as handle:
                    while chunk := handle.read(_CHUNK):
                        yield chunk
            else:
                with self.filesystem().open(self._path(uri), "rb", block_size=_CHUNK) as handle:
                    while chunk := handle.read(_CHUNK):
                        yield chunk
        except FileNotFoundError:
            raise
        except Exception as exc:  # a generator: ``_answers`` cannot wrap it
            failure = self.no_answer("read", uri, exc)
            if failure is not None:
                raise failure from exc
            if isinstance(exc, OSError):
                raise StorageError(f"tier {self.name}: cannot read {uri}: {exc}") from exc
            raise

    def sha256(self, uri: str, *, cap: BandwidthCap | None = None) -> str:
        """Stream the object and hash it (reads at the destination: this is the verification); every chunk read is
        charged to ``cap`` when given."""
        digest = hashlib.sha256()
        for chunk in cap.metered(self.chunks(uri)) if cap is not None else self.chunks(uri):
            digest.update(chunk)
        return digest.hexdigest()

    def verify(self, uri: str, *, size: int, sha256: str, cap: BandwidthCap | None = None) -> bool:
        """True when the object exists with exactly this size and sha256 (its bytes read under ``cap`` if given)."""
        if self.size(uri) != size:
            return False
        try:
            return self.sha256(uri, cap=cap) == sha256
        except FileNotFoundError:
            return False

    @_answers("write")
    def publish(self, uri: str, data: bytes) -> None:
        """Write ``data`` at ``uri`` atomically: readers see the old object or the whole new one."""
        try:
            if isinstance(self.spec, CfsTier):
                _publish_posix(Path(uri), data, direct_io=self.spec.direct_io)
            elif isinstance(self.spec, CephTier):
                fs = self.filesystem()
                fs.pipe_file(self._path(uri), data)  # one PUT (or one completed multipart upload)
                fs.invalidate_cache(self._path(uri).rsplit("/", 1)[0])
            else:
                fs = self.filesystem()
                path = self._path(uri)
                parent, name = path.rsplit("/", 1)
                fs.mkdir(parent)  # MKDIRS: creates parents, fine when present
                temp = f"{parent}/.{name}.partial-{uuid.uuid4().hex[:12]}"
                with fs.open(temp, "wb") as handle:
                    handle.write(data)
                try:
                    _rename_over(fs, temp, path)
                except OSError:
                    _remove_quietly(fs, temp)
                    raise
        except OSError as exc:
            raise self._write_error(uri, exc) from exc

    def publish_stream(self, uri: str, chunks: Iterable[bytes], *, size: int | None, sha256: str | None
                       ) -> tuple[int, str]:
        """Write ``chunks`` at ``uri`` atomically, one chunk held at a time; the object appears only when the bytes
        are ``size`` long and hash to ``sha256`` (else IntegrityError, and ``uri`` is unchanged). An error raised by
        ``chunks`` (the source) also leaves ``uri`` unchanged and propagates. cfs and hdfs write a temp file and
        rename it; ceph completes a multipart upload (or one PUT below a part) at the end, or aborts it. Returns the
        size and sha256 of what was written: with ``size=None, sha256=None`` the bytes are hashed as they are
        written, not checked (a writer that makes them need not hash them in a pass of its own)."""
        digest = hashlib.sha256()
        written = 0
        source_failed = False  # an error of ``chunks`` propagates as it is, not as this tier's StorageError

        def write(handle: Any) -> None:
            nonlocal written, source_failed
            iterator = iter(chunks)
            while True:
                try:
                    chunk = next(iterator)
                except StopIteration:
                    break
                except BaseException:
                    source_failed = True
                    raise
                digest.update(chunk)
                written += len(chunk)
                handle.write(chunk)
            if (size is not None and written != size) or (sha256 is not None and digest.hexdigest() != sha256):
                raise IntegrityError(f"tier {self.name}: the bytes for {uri} do not match (size {written}, sha256 "
                                     f"{digest.hexdigest()[:12]}...; expected {size}, {(sha256 or 'any')[:12]}...); "
                                     "not published")

        try:
            if isinstance(self.spec, CfsTier):
                path = Path(uri)
                path.parent.mkdir(parents=True, exist_ok=True)
                temp = path.parent / f".{path.name}.partial-{uuid.uuid4().hex[:12]}"
                try:
                    with open(temp, "wb") as handle:
                        _hold(handle.fileno())
                        write(handle)
                        handle.flush()
                        os.fsync(handle.fileno())  # on NFS, rename only publishes what the server holds
                        os.replace(temp, path)  # still held: a sweep never takes a temp file being renamed
                except BaseException:
                    temp.unlink(missing_ok=True)
                    raise
            elif isinstance(self.spec, CephTier):
                fs = self.filesystem()
                handle = fs.open(self._path(uri), "wb", block_size=_CHUNK)  # parts of 8 MiB (S3's least is 5 MiB)
                try:
                    write(handle)
                    handle.close()  # uploads the last part and completes the upload: it can fail too
                except BaseException:
                    try:
                        handle.discard()  # aborts the multipart upload: nothing appears, no parts stay stored
                    except Exception as abort_error:  # keep the original error; the upload is left to the bucket
                        log.warning("tier %s: could not abort the upload of %s: %s", self.name, uri, abort_error)
                    handle.closed = True
                    raise
                fs.invalidate_cache(self._path(uri).rsplit("/", 1)[0])
            else:
                fs = self.filesystem()
                parent, name = self._path(uri).rsplit("/", 1)
                fs.mkdir(parent)
                partial = f"{parent}/.{name}.partial-{uuid.uuid4().hex[:12]}"
                try:
                    with fs.open(partial, "wb") as handle:
                        write(handle)
                    _rename_over(fs, partial, f"{parent}/{name}")
                except BaseException:
                    _remove_quietly(fs, partial)
                    raise
        except Exception as exc:
            if source_failed:
                raise
            failure = self.no_answer("write", uri, exc)
            if failure is not None:
                raise failure from exc
            if isinstance(exc, OSError):
                raise self._write_error(uri, exc) from exc
            raise
        return written, digest.hexdigest()

    def _write_error(self, uri: str, exc: OSError) -> StorageError:
        """What a failed write says. s3fs raises ``FileNotFoundError(None)`` for a missing bucket (the botocore
        ``NoSuchBucket`` is its cause), which printed as ``cannot write URI: None``."""
        cause = exc.__cause__
        response = getattr(cause, "response", None)
        error = response.get("Error", {}) if isinstance(response, dict) else {}
        if isinstance(self.spec, CephTier) and error.get("Code") == "NoSuchBucket":
            return StorageError(f"tier {self.name}: cannot write {uri}: bucket {self.spec.bucket!r} does not exist on "
                                f"{self.spec.endpoint_url}; create it (e.g. aws --endpoint-url "
                                f"{self.spec.endpoint_url} s3 mb s3://{self.spec.bucket}), or fix "
                                f"tiers.{self.name}.bucket in the storage config")
        reason = cause if cause is not None and str(exc) == "None" else exc  # s3fs's bare errors: say botocore's
        return StorageError(f"tier {self.name}: cannot write {uri}: {reason}")

    def publish_verified(self, uri: str, data: bytes, *, sha256: str | None = None) -> str:
        """Publish, then read back and compare sha256; returns the digest. Raises IntegrityError on mismatch."""
        expected = sha256 or hashlib.sha256(data).hexdigest()
        self.publish(uri, data)
        if not self.verify(uri, size=len(data), sha256=expected):
            raise IntegrityError(f"tier {self.name}: {uri} does not match what was written (size {len(data)}, "
                                 f"sha256 {expected[:12]}...); check the tier's health and re-run")
        return expected

    @_answers("delete")
    def delete(self, uri: str, *, recursive: bool = False) -> None:
        """Delete an object (or a directory with ``recursive``); missing is fine."""
        try:
            if isinstance(self.spec, CfsTier):
                import shutil

                if recursive and os.path.isdir(uri):
                    shutil.rmtree(uri, ignore_errors=True)
                else:
                    Path(uri).unlink(missing_ok=True)
                return
            fs = self.filesystem()
            path = self._path(uri)
            if isinstance(self.spec, CephTier):
                fs.invalidate_cache(path)
                # S3 has no directories: one listing and one bulk DeleteObjects, not exists + expand + rmdir
                objects = fs.find(path) if recursive else [path]
                if objects:
                    fs.rm(objects)
                fs.invalidate_cache(path)
                return
            if fs.exists(path):
                fs.rm(path, recursive=recursive)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot delete {uri}: {exc}") from exc

    @_answers("clean up")
    def sweep_partials(self, directory_uri: str, *, older_than: float | None = None) -> int:
        """Remove what a killed ``publish``/``publish_stream`` left in a directory; returns how many were removed.

        cfs and hdfs: the temp files (``.NAME.partial-HEX``). ceph: the incomplete multipart uploads of keys
        directly in the directory (a process killed during ``publish_stream`` leaves its stored parts, which no
        listing shows and which otherwise stay until the bucket's lifecycle rule, AbortIncompleteMultipartUpload);
        keys in subdirectories or elsewhere in the bucket are not touched.
        ``older_than`` (seconds): spare a live writer's upload in the same directory. cfs: a temp file its writer
        still holds (a lock from creation to rename; any unlocked one goes, whatever its age; where the filesystem
        has no locks, one not written to for ``older_than``). hdfs: one whose modificationTime is older (HDFS sets
        it when the file is created and closed, so there the age counts from the start of the write). ceph: an
        upload whose newest part's LastModified (its Initiated when it has no part) is older.
        ``STALE_PARTIAL_S`` suits callers that cannot rule out a concurrent writer. None: everything, also a live
        writer's (the caller guarantees that no writer is publishing into the directory).
        """
        cutoff = None if older_than is None else time.time() - older_than  # written to after it: a live writer
        if isinstance(self.spec, CephTier):
            return self._abort_uploads(directory_uri, cutoff)
        try:
            if isinstance(self.spec, CfsTier):
                directory = Path(directory_uri)
                temps = [p for p in directory.iterdir() if _PARTIAL.match(p.name)] if directory.is_dir() else []
                stale = [p for p in temps if older_than is None or _abandoned(p, older_than)]
                for temp in stale:
                    temp.unlink(missing_ok=True)
                return len(stale)
            fs = self.filesystem()
            entries = [e for e in fs.ls(self._path(directory_uri), detail=True) if _PARTIAL.match(e["name"].rsplit("/", 1)[-1])]
            stale_names = [e["name"] for e in entries
                           if cutoff is None or e.get("modificationTime", 0) / 1000 <= cutoff]
            for entry in stale_names:
                _remove_quietly(fs, entry)
            return len(stale_names)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot list {directory_uri}: {exc}") from exc

    def _abort_uploads(self, directory_uri: str, cutoff: float | None) -> int:
        """Abort the incomplete multipart uploads of keys directly in ``directory_uri`` (one listing by prefix,
        paged; an upload already gone, e.g. aborted by a concurrent sweep, counts as done) that were last written to
        at or before ``cutoff`` (a POSIX time; None: all)."""
        fs = self.filesystem()
        bucket, _, key = self._path(directory_uri).partition("/")
        prefix = f"{key.strip('/')}/" if key.strip("/") else ""
        stale: list[tuple[str, str]] = []
        try:
            markers: dict[str, str] = {}
            while True:
                page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers)
                stale += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])
                          if "/" not in u["Key"][len(prefix):]
                          and (cutoff is None or u["Initiated"].timestamp() <= cutoff)]  # started later: live
                if not page.get("IsTruncated"):
                    break
                markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
            if cutoff is not None:
                stale = [(k, u) for k, u in stale if self._last_part_written(bucket, k, u, default=cutoff) <= cutoff]
            for upload_key, upload_id in stale:
                try:
                    fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload_key, UploadId=upload_id)
                except FileNotFoundError:  # NoSuchUpload: completed or aborted meanwhile
                    pass
        except FileNotFoundError:  # no such bucket
            return 0
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot abort the incomplete uploads in {directory_uri}: {exc}") from exc
        if stale:
            log.info("tier %s: aborted %d incomplete upload(s) in %s", self.name, len(stale), directory_uri)
        return len(stale)

    def _last_part_written(self, bucket: str, key: str, upload_id: str, *, default: float) -> float:
        """When the newest part of an upload was stored (POSIX time; ListParts, paged), ``default`` without parts;
        +inf when the upload is gone (completed or aborted meanwhile: nothing to abort)."""
        fs = self.filesystem()
        newest = default
        markers: dict[str, int] = {}
        while True:
            try:
                page = fs.call_s3("list_parts", Bucket=bucket, Key=key, UploadId=upload_id, **markers)
            except FileNotFoundError:
                return float("inf")
            newest = max([newest, *(part["LastModified"].timestamp() for part in page.get("Parts", []))])
            if not page.get("IsTruncated"):
                return newest
            markers = {"PartNumberMarker": int(page["NextPartNumberMarker"])}

    @_answers("list")
    def live_writes(self, directory_uri: str, *, within: float) -> list[str]:
        """The files under ``directory_uri`` (at any depth) that show a writer at work: an export's journal (a path
        through a ``_partial`` folder) or a publish's temp file, written to in the last ``within`` seconds. A tier
        apply must not delete such a directory as a leftover: a second-tier export (or token export) writes its
        shards and journal there before the manifest names the tier."""
        cutoff = time.time() - within
        found: list[tuple[str, float]] = []
        try:
            if isinstance(self.spec, CfsTier):
                for folder, _, names in os.walk(directory_uri):
                    for name in names:
                        path = os.path.join(folder, name)
                        try:
                            found.append((path, os.stat(path).st_mtime))
                        except FileNotFoundError:
                            continue
            else:
                fs = self.filesystem()
                root = self._path(directory_uri)
                if isinstance(self.spec, CephTier):
                    fs.invalidate_cache(root)
                for path, info in fs.find(root, detail=True).items():
                    modified = info.get("LastModified") or info.get("mtime")
                    stamp = (modified.timestamp() if hasattr(modified, "timestamp")
                             else info.get("modificationTime", 0) / 1000 if modified is None else float(modified))
                    found.append((path, stamp))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot list {directory_uri}: {exc}") from exc
        root = self._path(directory_uri).rstrip("/")
        return sorted(path for path, stamp in found if stamp > cutoff and (
            "_partial" in path[len(root):].split("/") or _PARTIAL.match(path.rsplit("/", 1)[-1])))

    @_answers("list")
    def children(self, directory_uri: str) -> list[str]:
        """The names directly in a directory (files and folders), sorted; empty when it is missing."""
        try:
            if isinstance(self.spec, CfsTier):
                return sorted(os.listdir(directory_uri)) if os.path.isdir(directory_uri) else []
            fs = self.filesystem()
            path = self._path(directory_uri).rstrip("/")
            if isinstance(self.spec, CephTier):
                fs.invalidate_cache(path)
            return sorted({entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)
                           if entry.rstrip("/") != path})
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot list {directory_uri}: {exc}") from exc

    @_answers("check")
    def exists(self, uri: str) -> bool:
        if isinstance(self.spec, CfsTier):
            return os.path.exists(uri)
        try:
            return bool(self.filesystem().exists(self._path(uri)))
        except OSError as exc:
            raise StorageError(f"tier {self.name}: cannot check {uri}: {exc}") from exc


def _rename_over(fs: Any, source: str, destination: str) -> None:
    """WebHDFS RENAME that replaces ``destination`` atomically.

    Plain RENAME (what fsspec's ``mv`` sends) refuses an existing destination and answers
    ``{"boolean": false}``, which fsspec ignores. With ``renameoptions=OVERWRITE`` the NameNode
    runs ``rename2(src, dst, OVERWRITE)`` (Hadoop's NamenodeWebHdfsMethods), which replaces
    the file in one namespace operation and raises (a RemoteException) when it cannot.
    """
    try:
        fs._call("RENAME", method="put", path=source, destination=destination, renameoptions="OVERWRITE")
    except RuntimeError as exc:  # fsspec's form of a RemoteException it has no OSError class for
        raise OSError(f"RENAME {source} -> {destination}: {exc}") from exc


def _remove_quietly(fs: Any, path: str) -> None:
    try:
        fs.rm(path)
    except (OSError, RuntimeError):  # best effort: the original error is the one to report
        pass


_PARTIAL = re.compile(r"^\..+\.partial-[0-9a-f]{12}$")  # publish's temp names (below and in Tier.publish)

# How long a publish's leftover must go unwritten before a sweep that cannot rule out a concurrent writer (tier apply:
# overlapping cron runs, a repair or a second region's apply into the same tier) removes it. A live publish writes its
# temp file or stores an upload part every 8 MiB (``_CHUNK``): seconds apart at disk or network speed, and under an
# hour down to a --max-mb-s cap of ~0.002 MB/s; an hour without a write is a killed writer. What a killed writer
# left stays up to that long (then the next sweep, or on ceph the bucket's lifecycle rule, removes it).
STALE_PARTIAL_S = 3600.0


# A cfs writer locks its temp file right after creating it (microseconds later; the GIL's switch interval is 5 ms): a
# sweep leaves an unlocked one this young alone. Short, since a re-run right after a killed export sweeps its leftovers.
_LOCK_WINDOW_S = 0.1


def _hold(fd: int) -> None:
    """Lock a cfs temp file for as long as its writer has it open (until the rename), so that a sweep can tell a
    live writer's temp file from a killed one's at any age (the lock goes with the process)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a sweep holds it for a moment at most
    except OSError:  # no locks here (ENOLCK: NFS without lockd): sweeps go by the file's age
        pass


def _abandoned(path: Path, older_than: float) -> bool:
    """True when no writer holds the cfs temp file ``path`` (its lock is free and it is not brand new), or, where
    the filesystem has no locks, when it was not written to for ``older_than`` seconds."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # a write descriptor: NFS locks an fd opened for writing only
    except FileNotFoundError:  # renamed into place or removed meanwhile
        return False
    except OSError:
        try:
            return path.stat().st_mtime <= time.time() - older_than
        except FileNotFoundError:
            return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live writer holds it
        except OSError:  # no locks here
            return os.fstat(fd).st_mtime <= time.time() - older_than
        return os.fstat(fd).st_mtime <= time.time() - min(older_than, _LOCK_WINDOW_S)
    finally:
        os.close(fd)  # a writer never reopens a temp name, so removing it after this is safe


def _publish_posix(path: Path, data: bytes, *, direct_io: Literal["auto", "on", "off"] = "off") -> None:
    """Write ``data`` at ``path`` atomically: a locked temp file, fsync, rename. ``direct_io`` (the cfs tier's
    setting): ``auto`` writes an object of at least ``_DIRECT_MIN`` bytes with O_DIRECT where the filesystem accepts
    it, else buffered; ``on`` raises where it refuses; ``off`` writes buffered."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.partial-{uuid.uuid4().hex[:12]}"
    try:
        with open(temp, "wb", buffering=0) as handle:
            _hold(handle.fileno())
            view = memoryview(data).cast("B")
            direct = direct_io == "on" or (direct_io == "auto" and _direct_by_default(str(path.parent)))
            written = (_write_direct(handle.fileno(), view, required=direct_io == "on")
                       if direct and len(view) >= _DIRECT_MIN else 0)
            _write_buffered(handle.fileno(), view, written)
            os.fsync(handle.fileno())  # on NFS, rename only publishes what the server holds
            os.replace(temp, path)  # still held: a sweep never takes a temp file being renamed
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


# ``direct_io: auto`` writes directly only on a local block-device filesystem, where it was measured (ext4 here).
# On NFS (a CFS mount) each direct write waits for the server's commit, a 32 MB shard becoming 8 serial round trips;
# on FUSE mounts and tmpfs there is no page-cache copy worth skipping or no device behind it: buffered there.
_DIRECT_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "jfs", "bcachefs"})


@functools.lru_cache(maxsize=256)
def _direct_by_default(directory: str) -> bool:
    """Whether ``direct_io: auto`` writes with O_DIRECT in ``directory``: its mount's filesystem type is a local
    block-device one (``_DIRECT_FILESYSTEMS``; the longest mount point above it in /proc/self/mounts)."""
    return _filesystem_type(os.path.realpath(directory)) in _DIRECT_FILESYSTEMS


def _filesystem_type(path: str, table: str = "/proc/self/mounts") -> str | None:
    """The type of the filesystem mounted at the longest mount point above ``path`` (None off Linux)."""
    try:
        with open(table, encoding="utf-8", errors="replace") as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return None
    best, kind = "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # \040 is a space
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _write_buffered(fd: int, view: memoryview, written: int) -> None:
    """Write ``view[written:]`` through the page cache in small pieces (see _WRITE_PIECE), starting the writeback
    of every _WRITEBACK_PIECE written; a write may be short."""
    flushed = written
    while written < len(view):
        written += os.write(fd, view[written:written + _WRITE_PIECE])
        if written - flushed >= _WRITEBACK_PIECE:  # start writing back what is written (fsync waits less)
            _start_writeback(fd, flushed, written - flushed)
            flushed = written


def _write_direct(fd: int, view: memoryview, *, required: bool) -> int:
    """Write the page-multiple head of ``view`` to the empty file ``fd`` with O_DIRECT, ``_DIRECT_PIECE`` per write
    (from ``view`` itself when it is page-aligned, else through this thread's aligned bounce buffer); returns the
    bytes written, for the rest to be written buffered. Where the filesystem refuses O_DIRECT (ramfs, tmpfs before
    Linux 6.6, some FUSE mounts: EINVAL when the flag is set or at a write) that is 0 or where it stopped, or an
    OSError when ``required``. The file is left without O_DIRECT."""
    head = len(view) - len(view) % _DIRECT_ALIGN
    if not _set_direct(fd, True):
        if required:
            raise OSError(errno.EINVAL, "the filesystem refuses O_DIRECT (direct_io: on); set direct_io: auto or off")
        return 0
    written = 0
    try:
        address = _address(view)
        bounce = None if address is not None and address % _DIRECT_ALIGN == 0 else _bounce_buffer()
        while written < head:
            stop = min(written + _DIRECT_PIECE, head)
            if bounce is None:
                piece = view[written:stop]
            else:
                piece = bounce[:stop - written]
                piece[:] = view[written:stop]
            try:
                count = os.write(fd, piece)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                if required:
                    raise OSError(exc.errno, f"an O_DIRECT write was refused ({exc.strerror}; direct_io: on); "
                                             "set direct_io: auto or off") from exc
                break  # the flag was taken but the write refused: the rest goes buffered
            written += count
            if count != len(piece):  # short (the next offset may be unaligned): the rest goes buffered
                break
    finally:
        _set_direct(fd, False)
    return written


def _set_direct(fd: int, on: bool) -> bool:
    """Set or clear O_DIRECT on an open file; False where the filesystem (or the platform) refuses it."""
    if not _O_DIRECT:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT if on else flags & ~_O_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    return True


def _address(view: memoryview) -> int | None:
    """Where a writable buffer's first byte is in memory; None for a read-only one (e.g. ``bytes``) or an empty one."""
    if view.readonly or not len(view):
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


_bounce = threading.local()


def _bounce_buffer() -> memoryview:
    """This thread's page-aligned ``_DIRECT_PIECE`` buffer for direct writes of unaligned memory (an anonymous
    mapping: page-aligned; kept for the thread's life, so an export's upload threads map it once)."""
    buffer: memoryview | None = getattr(_bounce, "buffer", None)
    if buffer is None:
        buffer = _bounce.buffer = memoryview(mmap.mmap(-1, _DIRECT_PIECE, flags=mmap.MAP_PRIVATE))
    return buffer


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``: start writing the range back without waiting for it (the
    fsync after the last piece then waits for less); a no-op where libc has no such call."""
    call = _sync_file_range()
    if call is not None:
        call(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # a failure only leaves the work to fsync


@functools.cache
def _sync_file_range() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    call = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if call is not None:
        call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        call.restype = ctypes.c_int
    return call


def _read_credentials_file(path: Path, *, where: str) -> dict[str, str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{where}.file: cannot read {path}: {exc.strerror}") from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "[")):
            continue
        sep = "=" if "=" in line else ":"
        name, _, value = line.partition(sep)
        values[name.strip().lower()] = value.strip().strip("'\"")
    return values
