"""Expand a job's inputs (paths, globs, URIs) into files with a stable identity."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.config.spec import InputSpec
from datahub.errors import OperatorError, SpecError
from datahub.lake.lake import fsspec_options
from datahub.retry import DEFAULT_POLICY, RetryPolicy, retry_policy, storage_errors
from operators.ingest.base import InputFile, detect_format, reader_for
from operators.ingest.stream import file_identity


@dataclass(frozen=True)
class InputListing:
    """The files a job's inputs match now, and the inputs that matched none (``inputs.N.uri '...' matches no file
    now``), which only listings given ``read_before`` return."""

    files: list[InputFile]
    unmatched: list[str] = field(default_factory=list)


def list_input_files(inputs: Iterable[InputSpec], *, source: str = "<spec>",
                     retry: RetryPolicy = DEFAULT_POLICY) -> list[InputFile]:
    """Every file matched by the inputs, sorted by URI; identity = uri + size + etag/mtime.

    Listing is retried with backoff when storage does not answer (``StorageError``), so a
    scheduled run that starts during an S3 endpoint restart waits instead of failing.
    An input that matches no file is an error.
    """
    return list_inputs(inputs, source=source, retry=retry).files


def list_inputs(inputs: Iterable[InputSpec], *, source: str = "<spec>", retry: RetryPolicy = DEFAULT_POLICY,
                read_before: Callable[[], pa.Array | None] | None = None, job: str = "") -> InputListing:
    """``list_input_files``, except that an input that matches no file now but did match a file an earlier run of
    the job read is listed in ``unmatched`` instead of refused: a landing directory emptied after earlier runs.
    ``read_before()`` gives those files' URIs as listed then (None: the job never ran); it is called only when an
    input matched nothing, once. An input no earlier run read from (a typo in an edited spec, a first run) and a
    local path whose directory does not exist stay errors."""
    files: dict[str, InputFile] = {}
    unmatched: list[str] = []
    earlier: list[pa.Array | None] = []  # read_before()'s answer, once asked
    for index, spec in enumerate(inputs):
        options = fsspec_options(spec.storage_options) if any(k.isupper() for k in spec.storage_options) else dict(spec.storage_options)
        protocol, listed = retry_policy(partial(_list, spec, options), retry)
        if not listed:
            missing = _missing_local_directory(spec.uri, protocol)
            if missing is not None:
                raise SpecError(f"{source}: inputs.{index}.uri: {spec.uri!r} matches no file and its directory "
                                f"{missing} does not exist; check the path (or the mount)")
            if read_before is not None and not earlier:
                earlier.append(read_before())
            if read_before is None or earlier[0] is None:
                raise SpecError(f"{source}: inputs.{index}.uri: {spec.uri!r} matches no file; check the path or glob")
            if not _read_from(spec.uri, protocol, earlier[0]):
                raise SpecError(f"{source}: inputs.{index}.uri: {spec.uri!r} matches no file, and no earlier run of job "
                                f"{job!r} read a file from it; check the path or glob")
            unmatched.append(f"inputs.{index}.uri {spec.uri!r} matches no file now")
            continue
        for path, info in listed:
            uri = path if protocol in ("file", "local") else f"{protocol}://{path}"
            if protocol in ("file", "local") and not uri.startswith("/"):
                uri = "/" + uri
            fmt = spec.format if spec.format != "auto" else detect_format(uri)
            try:  # before any engine starts: a read task would fail on it, deep in the engine's logs
                reader_for(fmt, spec.kind)
            except OperatorError as exc:
                raise SpecError(f"{source}: inputs.{index}: {uri}: {exc}") from None
            size, etag, mtime = file_identity(info)
            files[uri] = InputFile(
                uri=uri,
                size=size,
                etag=etag,
                mtime=mtime,
                format=fmt,
                text_field=spec.text_field,
                kind=spec.kind,
                storage_options=tuple(sorted(options.items())) if options else (),
            )
    return InputListing([files[k] for k in sorted(files)], unmatched)


def _read_from(uri: str, protocol: str, earlier: pa.Array) -> bool:
    """Whether one of the ``earlier`` files (URIs as a listing gave them) is matched by input ``uri``: by its glob,
    or under it as a directory, or as the file itself (vectorized over the URIs)."""
    local = protocol in ("file", "local")
    pattern = os.path.abspath(uri.removeprefix("file://")) if local else uri
    if any(c in pattern for c in "*?["):
        hits = pc.match_substring_regex(earlier, _glob_regex(pattern))
    else:
        hits = pc.or_(pc.equal(earlier, pattern), pc.starts_with(earlier, pattern.rstrip("/") + "/"))
    return bool(pc.any(hits).as_py())


def _glob_regex(pattern: str) -> str:
    """``pattern`` (fnmatch's rules: ``*`` any run, ``?`` one character, ``[...]``/``[!...]`` a set) as an anchored
    RE2 regex for Arrow. Not ``fnmatch.translate``: Python 3.11 writes an atomic group ``(?>...)`` for every ``*`` but
    the last, which RE2 refuses."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i + 1 if i < n and pattern[i] == "!" else i
            j = j + 1 if j < n and pattern[j] == "]" else j  # a ']' first in the set is one of its characters
            j = pattern.find("]", j)
            if j == -1:  # no closing ']': a literal '['
                out.append(re.escape(c))
                continue
            body, i = pattern[i:j], j + 1
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\").replace("^", "\\^")
                       .replace("[", "\\[").replace("]", "\\]") + "]")
        else:
            out.append(re.escape(c))
    return "(?s)^" + "".join(out) + "\\z"


def _missing_local_directory(uri: str, protocol: str) -> str | None:
    """The local directory a path or glob lists (the part before its first wildcard), when it does not exist."""
    if protocol not in ("file", "local"):
        return None
    path = uri.removeprefix("file://")
    parts = Path(os.path.abspath(path)).parts
    wild = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), None)
    directory = Path(*parts[:wild]) if wild is not None else Path(*parts).parent
    return None if directory.is_dir() else str(directory)


def _list(spec: InputSpec, options: dict[str, Any]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """One try at listing one input: its protocol and (path, info) of every file it matches."""
    import fsspec

    with storage_errors(f"list {spec.uri}"):
        fs, _ = fsspec.core.url_to_fs(spec.uri, **options)
        if any(c in spec.uri for c in "*?["):
            paths = [p for p in fs.glob(spec.uri) if fs.isfile(p)]
        elif fs.isdir(spec.uri):
            paths = [p for p in fs.find(spec.uri) if fs.isfile(p)]
        else:
            # the filesystem's own name for it: absolute on a local disk, without the protocol on object stores
            paths = [fs._strip_protocol(spec.uri)] if fs.exists(spec.uri) else []
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        return str(protocol), [(path, fs.info(path)) for path in paths]
