"""The token export manifest (schemas/tokens-manifest.v1.json): the tokenizer, and every indexed file's parts.

Written by ``datahub.export.tokens`` last and atomically, in the token directory of each tier holding the files
(``{release}/tokens-{sha12}/tokens-manifest.json``) and under the lake
(``{lake}/_exports/{release}/tokens-{sha12}.json``, where a reader resolves a release name); ``sha12`` is the
first 12 hex digits of the tokenizer's sha256, so one release can be tokenized by several tokenizers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from datahub.errors import IntegrityError, LakeError
from datahub.lake.lake import Lake, fsspec_options
from datahub.storage.tier import Tier, _publish_posix

TOKEN_MANIFEST_VERSION = 1
TOKEN_FORMAT = "megatron-mmidx-1"
TOKEN_MANIFEST_NAME = "tokens-manifest.json"
PARTS = ("bin", "idx", "ids")


def token_dir(tokenizer_sha256: str) -> str:
    """The folder of a release's token files on a tier, by tokenizer."""
    return f"tokens-{tokenizer_sha256[:12]}"


@dataclass(frozen=True)
class TokenizerInfo:
    sha256: str
    vocab_size: int
    eod_id: int
    eod_token: str
    add_special_tokens: bool = False
    kind: str = "tokenizers-json"
    source: str = ""


@dataclass(frozen=True)
class FilePart:
    size: int
    sha256: str


@dataclass(frozen=True)
class TokenFileRecord:
    """One indexed dataset: ``{replica}.bin/.idx/.ids``, documents ``[first_document, +documents)`` of the order."""

    prefix: str
    documents: int
    tokens: int
    first_document: int
    bin: FilePart
    idx: FilePart
    ids: FilePart
    replicas: dict[str, str] = field(default_factory=dict)  # tier -> URI of the prefix

    def part(self, name: str) -> FilePart:
        return {"bin": self.bin, "idx": self.idx, "ids": self.ids}[name]


@dataclass(frozen=True)
class TokenManifest:
    release: str
    created: str
    table: str
    table_version: int
    release_digest: str
    shuffle_seed: int | None
    tokenizer: TokenizerInfo
    dtype: str
    files: tuple[TokenFileRecord, ...]
    export: dict[str, Any] = field(default_factory=dict)
    manifest_version: int = TOKEN_MANIFEST_VERSION
    format: str = TOKEN_FORMAT

    @property
    def num_documents(self) -> int:
        return sum(f.documents for f in self.files)

    @property
    def num_tokens(self) -> int:
        return sum(f.tokens for f in self.files)

    @property
    def tiers(self) -> list[str]:
        """Tiers that hold a replica of every file."""
        if not self.files:
            return sorted(self.export.get("tiers", []))
        common = set(self.files[0].replicas)
        for record in self.files[1:]:
            common &= set(record.replicas)
        return sorted(common)

    def to_dict(self) -> dict[str, Any]:
        return {"manifest_version": self.manifest_version, "format": self.format, "release": self.release,
                "created": self.created, "table": self.table, "table_version": self.table_version,
                "release_digest": self.release_digest, "shuffle_seed": self.shuffle_seed,
                "tokenizer": asdict(self.tokenizer), "dtype": self.dtype, "num_documents": self.num_documents,
                "num_tokens": self.num_tokens, "export": self.export, "files": [asdict(f) for f in self.files]}

    def to_json(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1) + "\n").encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "tokens manifest") -> TokenManifest:
        try:
            if int(data["manifest_version"]) != TOKEN_MANIFEST_VERSION or data["format"] != TOKEN_FORMAT:
                raise IntegrityError(f"{where}: manifest_version {data['manifest_version']} / format {data['format']!r} "
                                     f"is not supported (this datahub reads {TOKEN_MANIFEST_VERSION} / {TOKEN_FORMAT})")
            files = tuple(TokenFileRecord(prefix=str(f["prefix"]), documents=int(f["documents"]), tokens=int(f["tokens"]),
                                          first_document=int(f["first_document"]),
                                          **{p: FilePart(int(f[p]["size"]), str(f[p]["sha256"])) for p in PARTS},
                                          replicas={str(t): str(u) for t, u in f["replicas"].items()})
                          for f in data["files"])
            manifest = cls(release=str(data["release"]), created=str(data["created"]), table=str(data["table"]),
                           table_version=int(data["table_version"]), release_digest=str(data["release_digest"]),
                           shuffle_seed=data["shuffle_seed"], tokenizer=TokenizerInfo(**data["tokenizer"]),
                           dtype=str(data["dtype"]), files=files, export=dict(data.get("export") or {}))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IntegrityError(f"{where}: malformed token manifest, missing or bad field ({type(exc).__name__}: "
                                 f"{exc}); re-run datahub export --tokenizer") from None
        if (manifest.num_documents, manifest.num_tokens) != (int(data["num_documents"]), int(data["num_tokens"])):
            raise IntegrityError(f"{where}: num_documents/num_tokens disagree with the files; re-export the release")
        return manifest


def lake_token_manifest_uri(lake: Lake, release: str, tokenizer_sha256: str) -> str:
    return f"{lake.root}/_exports/{release}/{token_dir(tokenizer_sha256)}.json"


def read_lake_token_manifest(lake: Lake, release: str, tokenizer_sha256: str | None = None) -> TokenManifest | None:
    """The token manifest of ``release`` for a tokenizer (its sha256, or a prefix of 12+ hex digits), or the only
    one when ``tokenizer_sha256`` is None; None when the release was never tokenized (with that tokenizer)."""
    import fsspec

    folder = f"{lake.root}/_exports/{release}"
    fs, path = fsspec.core.url_to_fs(folder, **fsspec_options(lake.storage_options))
    try:
        if tokenizer_sha256 is not None:
            names = [f"{token_dir(tokenizer_sha256)}.json"]
        else:
            names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)
                           if p.rsplit("/", 1)[-1].startswith("tokens-") and p.endswith(".json"))
            if len(names) > 1:
                raise LakeError(f"{folder}: release {release!r} is tokenized with {len(names)} tokenizers "
                                f"({', '.join(n[7:-5] for n in names)}); name one by its sha256")
        if not names:
            return None
        data = fs.cat_file(f"{path}/{names[0]}")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LakeError(f"{folder}: cannot read the token manifest: {exc}") from exc
    return TokenManifest.from_dict(json.loads(data), where=f"{folder}/{names[0]}")


def read_lake_token_manifests(lake: Lake, release: str) -> list[TokenManifest]:
    """Every token manifest of ``release`` (one per tokenizer), in folder order; empty when it was never tokenized."""
    import fsspec

    folder = f"{lake.root}/_exports/{release}"
    fs, path = fsspec.core.url_to_fs(folder, **fsspec_options(lake.storage_options))
    try:
        if "s3" in str(fs.protocol):
            fs.invalidate_cache(path)
        names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LakeError(f"{folder}: cannot list the token manifests: {exc}") from exc
    found = []
    for name in names:
        if name.startswith("tokens-") and name.endswith(".json"):
            manifest = read_lake_token_manifest(lake, release, name[len("tokens-"):-len(".json")])
            if manifest is not None:
                found.append(manifest)
    return found


def publish_lake_token_manifest(lake: Lake, manifest: TokenManifest) -> str:
    """Write the manifest under the lake root atomically (rename on POSIX, one PUT on S3)."""
    import fsspec

    uri = lake_token_manifest_uri(lake, manifest.release, manifest.tokenizer.sha256)
    if lake.is_local:
        from pathlib import Path

        _publish_posix(Path(uri.removeprefix("file://")), manifest.to_json())
        return uri
    fs, path = fsspec.core.url_to_fs(uri, **fsspec_options(lake.storage_options))
    fs.pipe_file(path, manifest.to_json())
    fs.invalidate_cache(path.rsplit("/", 1)[0])
    return uri


def read_tier_token_manifest(tier: Tier, release: str, tokenizer_sha256: str) -> TokenManifest | None:
    uri = tier.uri(release, token_dir(tokenizer_sha256), TOKEN_MANIFEST_NAME)
    try:
        data = tier.read(uri)
    except FileNotFoundError:
        return None
    return TokenManifest.from_dict(json.loads(data), where=uri)
