"""Expand a job's inputs (paths, globs, URIs) into files with a stable identity."""

from __future__ import annotations

from collections.abc import Iterable

from datahub.config.spec import InputSpec
from datahub.errors import SpecError
from datahub.lake.lake import fsspec_options
from operators.ingest.base import InputFile, detect_format


def list_input_files(inputs: Iterable[InputSpec], *, source: str = "<spec>") -> list[InputFile]:
    """Every file matched by the inputs, sorted by URI; identity = uri + size + etag/mtime."""
    import fsspec

    files: dict[str, InputFile] = {}
    for index, spec in enumerate(inputs):
        options = fsspec_options(spec.storage_options) if any(k.isupper() for k in spec.storage_options) else dict(spec.storage_options)
        fs, _ = fsspec.core.url_to_fs(spec.uri, **options)
        if any(c in spec.uri for c in "*?["):
            paths = [p for p in fs.glob(spec.uri) if fs.isfile(p)]
        elif fs.isdir(spec.uri):
            paths = [p for p in fs.find(spec.uri) if fs.isfile(p)]
        else:
            paths = [spec.uri] if fs.exists(spec.uri) else []
        if not paths:
            raise SpecError(f"{source}: inputs.{index}.uri: {spec.uri!r} matches no file; check the path or glob")
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        for path in paths:
            info = fs.info(path)
            uri = path if protocol in ("file", "local") else f"{protocol}://{path}"
            if protocol in ("file", "local") and not uri.startswith("/"):
                uri = "/" + uri
            fmt = spec.format if spec.format != "auto" else detect_format(uri)
            etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
            mtime = info.get("mtime") or info.get("LastModified") or info.get("modificationTime") or ""
            files[uri] = InputFile(
                uri=uri,
                size=int(info.get("size") or 0),
                etag=etag,
                mtime=str(mtime),
                format=fmt,
                text_field=spec.text_field,
                storage_options=tuple(sorted(options.items())) if options else (),
            )
    return [files[k] for k in sorted(files)]
