"""Input files opened through fsspec, with storage failures told apart from bad data.

Readers quarantine what they cannot decode. A storage hiccup (connection refused while
radosgw restarts, a reset, a 503) is not bad data: it surfaces here, at the storage boundary,
as ``StorageError`` (a ``TransientError``) however deep inside a decoder the read happened,
so the caller retries the file instead of quarantining it.
"""

from __future__ import annotations

import io
from typing import Any

from datahub.errors import IntegrityError
from datahub.retry import storage_errors


class StorageStream(io.RawIOBase):
    """A seekable, read-only view of an fsspec file whose transient failures raise ``StorageError``."""

    def __init__(self, raw: Any, uri: str) -> None:
        super().__init__()
        self._raw = raw
        self.uri = uri

    @classmethod
    def open(cls, uri: str, storage_options: dict[str, Any]) -> StorageStream:
        import fsspec

        with storage_errors(f"open {uri}"):
            return cls(fsspec.open(uri, "rb", **storage_options).open(), uri)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._raw.seekable())

    def readinto(self, buffer: Any) -> int:
        with storage_errors(f"read {self.uri}"):
            return int(self._raw.readinto(buffer))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with storage_errors(f"seek {self.uri}"):
            return int(self._raw.seek(offset, whence))

    def tell(self) -> int:
        return int(self._raw.tell())

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()


def file_identity(info: dict[str, Any]) -> tuple[int, str, str]:
    """(size, etag, mtime) of an fsspec ``info()`` dict: what identifies one version of an input file."""
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    mtime = info.get("mtime") or info.get("LastModified") or info.get("modificationTime") or ""
    return int(info.get("size") or 0), etag, str(mtime)


def ensure_unchanged(uri: str, storage_options: dict[str, Any], *, size: int, etag: str, mtime: str) -> None:
    """Raise ``IntegrityError`` when the file at ``uri`` is no longer the version that was listed.

    A file re-read after a storage failure must be byte-identical to the first read, or the
    rows produced before the failure and the rows produced after it would mix two versions.
    """
    import fsspec

    with storage_errors(f"stat {uri}"):
        fs, path = fsspec.core.url_to_fs(uri, **storage_options)
        fs.invalidate_cache(path)
        try:
            info = fs.info(path)
        except FileNotFoundError:
            raise IntegrityError(f"{uri}: disappeared while it was being read; re-run the job once it is back") from None
    now_size, now_etag, now_mtime = file_identity(info)
    # an ETag names the bytes; without one, the mtime does (S3 listings and HEAD differ in mtime precision)
    then, now = ((size, etag), (now_size, now_etag)) if etag else ((size, mtime), (now_size, now_mtime))
    if then != now:
        raise IntegrityError(f"{uri}: changed while it was being read (size, {'etag' if etag else 'mtime'}: {then} -> {now}); "
                             "re-run the job to read the new version from the start")
