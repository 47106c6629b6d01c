"""`datahub export RELEASE --lake L --tier TIER`: deterministic WebDataset shards + manifest on a tier;
with `--tokenizer PATH`, Megatron token files (.bin/.idx + .ids) + token manifest instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from datahub.cli.lake_option import LAKE_HELP
from datahub.cli.output import console, print_json, progress


# the embedded Ray's object store for an export (MB). A text export's rows no longer pass through it (read tasks
# write sorted runs to local disk, write tasks read their pieces: datahub/engines/ray/export.py); a token export's
# shuffle still does (L of release_scale.py, 1.24 GB of shards: 2,075 MB peak uncapped, 1,508 MB at 512)
EMBEDDED_RAY_STORE_MB = 256


EXAMPLES = """Examples:
  datahub export corpus-v1 --lake lake/ --tier cfs --storage storage.yaml
  datahub export corpus-v1 --lake lake/ --tier ceph --storage storage.yaml \\
      --engine ray --address ray://head:10001 --workers 64
  datahub export corpus-v1 --lake lake/ --tier cfs --storage storage.yaml \\
      --tokenizer tok/tokenizer.json
  # again: check every replica by sha256, rewrite damaged shards
  datahub export corpus-v1 --lake lake/ --tier cfs --storage storage.yaml \\
      --verify"""


def register(app: typer.Typer) -> None:
    @app.command("export", epilog=EXAMPLES)
    def export(
        release: str = typer.Argument(..., help="Release name (shards are named RELEASE-NNNNNN.tar)."),
        lake: str = typer.Option(..., "--lake", help=LAKE_HELP),
        tier: str = typer.Option(..., "--tier", help="Tier name from the storage config: e.g. cfs, ceph, hdfs."),
        storage: Path = typer.Option(Path("storage.yaml"), "--storage", help="Storage YAML (schemas/storage.example.yaml)."),
        shard_size: Optional[str] = typer.Option(None, "--shard-size", help="Target shard size, e.g. 256MB (default)."),
        shard_samples: Optional[int] = typer.Option(None, "--shard-samples", help="Samples per shard instead of a size."),
        shuffle_seed: Optional[int] = typer.Option(None, "--shuffle-seed", help="Seeded sample order (default: by sample_id)."),
        table: Optional[str] = typer.Option(None, "--table", help="Export this table version instead of a release record."),
        version: Optional[int] = typer.Option(None, "--version", help="With --table: its Delta version (default: latest). A release exports the version it froze."),
        engine: str = typer.Option("local", "--engine", help="local (this process), ray or spark: engine tasks write "
                                   "whole shards straight to the tier; same bytes either way."),
        address: Optional[str] = typer.Option(None, "--address", help="With --engine ray|spark: a Ray cluster "
                                              "address or Spark master URL (default: an embedded local engine)."),
        workers: Optional[int] = typer.Option(None, "--workers", help="With --engine ray|spark: engine tasks at once (default: the engine's)."),
        object_store_mb: Optional[int] = typer.Option(None, "--object-store-mb", min=64, help="With --engine ray and no --address: cap on the embedded Ray's "
                                                      "shared-memory object store, beyond which the shuffle spills to "
                                                      f"local disk (default {EMBEDDED_RAY_STORE_MB}, so memory does not "
                                                      "grow with the release)."),
        verify: bool = typer.Option(False, "--verify", help="On a tier that holds the release, check replicas by "
                                    "sha256 too (not only size) and rewrite damaged ones."),
        tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenize instead: a tokenizers JSON file or a "
                                                 "Hugging Face tokenizer directory holding tokenizer.json (read from "
                                                 "disk, never downloaded). Writes Megatron indexed files RELEASE-NNNNNN"
                                                 ".bin/.idx (+ .ids: sample_id per document) under RELEASE/tokens-SHA12/ "
                                                 "on the tier, each document's tokens followed by the EOD id, in the "
                                                 "text export's order."),
        eod_token: Optional[str] = typer.Option(None, "--eod-token", help="With --tokenizer: the end-of-document token "
                                                "(default: tokenizer_config.json's eos_token, else <|endoftext|>, </s>, "
                                                "<|end_of_text|>, ...)."),
        file_tokens: Optional[int] = typer.Option(None, "--file-tokens", help="With --tokenizer: tokens per file "
                                                  "(default 134217728 = 2**27; a longer document gets a file of its own)."),
        add_special_tokens: bool = typer.Option(False, "--add-special-tokens", help="With --tokenizer: let the "
                                                "tokenizer's post-processor add its special tokens (e.g. BOS)."),
        as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    ) -> None:
        """Export a release as byte-reproducible WebDataset shards (or, with --tokenizer, Megatron token files);
        re-running resumes and skips verified files."""
        from datahub.cli.arguments import tier_answers
        from datahub.cli.lake_option import open_lake
        from datahub.export import export_release, export_table_version
        from datahub.storage import load_storage_config

        if engine not in ("local", "ray", "spark"):
            raise typer.BadParameter(f"use local, ray or spark, got {engine!r}", param_hint="--engine")
        _refuse_ignored_options(release, table=table, version=version, engine=engine, address=address,
                                workers=workers, object_store_mb=object_store_mb)
        config = load_storage_config(storage)
        the_lake = open_lake(lake)
        tier_answers(config, tier)
        options: dict[str, Any] = {"tier": tier, "storage": config, "shard_size": shard_size, "shard_samples": shard_samples,
                   "shuffle_seed": shuffle_seed, "workers": workers, "verify": verify}
        if tokenizer is None and (eod_token is not None or file_tokens is not None or add_special_tokens):
            raise typer.BadParameter("--eod-token, --file-tokens and --add-special-tokens go with --tokenizer",
                                     param_hint="--tokenizer")
        if tokenizer is not None and (shard_size is not None or shard_samples is not None):
            raise typer.BadParameter("--shard-size/--shard-samples size text shards; token files are cut by "
                                     "--file-tokens", param_hint="--tokenizer")
        running = None
        if engine != "local":
            from datahub.config.spec import EngineSpec
            from datahub.engines.registry import make_engine

            if engine == "ray":
                # the shuffle holds the encoded release in the object store: capped, the rest spills to disk
                store = None if address else object_store_mb or EMBEDDED_RAY_STORE_MB
                spec = EngineSpec(kind="ray", address=address, object_store_mb=store)
            else:
                spec = EngineSpec(kind="spark", master=address)
            running = make_engine(spec)
            running.start()
            options["engine"] = running
        if tokenizer is not None:
            try:
                _export_tokens(the_lake, release, tokenizer=tokenizer, table=table, version=version, tier=tier,
                               config=config, eod_token=eod_token, file_tokens=file_tokens,
                               add_special_tokens=add_special_tokens, shuffle_seed=shuffle_seed, engine=running or "local",
                               workers=workers, verify=verify, as_json=as_json)
            finally:
                if running is not None:
                    running.stop()
            return
        with progress(f"export {release}", enabled=not as_json) as update:
            if table is not None:
                chosen = version if version is not None else the_lake.table(table).version()
                manifest = export_table_version(the_lake, table=table, version=chosen, release_name=release,
                                                progress=update, **options)
            else:
                manifest = export_release(the_lake, release, progress=update, **options)
        if running is not None:
            running.stop()
        if as_json:
            print_json(manifest.to_dict())
            return
        total = sum(s.size for s in manifest.shards)
        out = console()
        out.print(f"[bold green]exported {manifest.release}[/] ({manifest.table}@v{manifest.table_version}) to tier {tier}")
        out.print(f"  shards     {len(manifest.shards)}  {manifest.shard_pattern}")
        out.print(f"  samples    {manifest.num_samples}")
        out.print(f"  bytes      {total}")
        out.print(f"  replicas   {', '.join(manifest.tiers)}")


def _refuse_ignored_options(release: str, *, table: str | None, version: int | None, engine: str,
                            address: str | None, workers: int | None, object_store_mb: int | None) -> None:
    """An option that the other options given make meaningless is an error, never dropped: `--version 0` of a
    release exported the version the release froze, and `--address` without `--engine` exported in this process."""
    from datahub.errors import SpecError

    if version is not None and table is None:
        raise SpecError(f"--version {version} goes with --table: release {release!r} already froze its table version; "
                        f"drop --version, or export that table version under a name of your own: "
                        f"--table samples --version {version}")
    if engine == "local" and address is not None:
        raise SpecError(f"--address {address} names a cluster, but --engine is local (this process): add --engine ray "
                        "(a Ray address) or --engine spark (a Spark master), or drop --address")
    if engine == "local" and workers is not None:
        raise SpecError(f"--workers {workers} sets how many engine tasks write at once, but --engine is local (this "
                        "process): add --engine ray or --engine spark, or drop --workers")
    if object_store_mb is not None and (engine != "ray" or address is not None):
        raise SpecError(f"--object-store-mb {object_store_mb} sizes the embedded Ray that --engine ray starts "
                        "without --address; a cluster's object store is set on the cluster (ray start "
                        "--object-store-memory): drop --object-store-mb")


def _export_tokens(the_lake: Any, release: str, *, tokenizer: Path, table: str | None, version: int | None,
                   tier: str, config: Any, eod_token: str | None, file_tokens: int | None, add_special_tokens: bool,
                   shuffle_seed: int | None, engine: Any, workers: int | None, verify: bool, as_json: bool) -> None:
    from datahub.export.tokens import DEFAULT_FILE_TOKENS, export_table_tokens, export_tokens

    options: dict[str, Any] = {"tokenizer": tokenizer, "tier": tier, "storage": config, "eod_token": eod_token,
                               "file_tokens": DEFAULT_FILE_TOKENS if file_tokens is None else file_tokens,  # 0 is refused
                               "add_special_tokens": add_special_tokens,
                               "shuffle_seed": shuffle_seed, "engine": engine, "workers": workers, "verify": verify}
    with progress(f"export {release} tokens", enabled=not as_json) as update:
        if table is not None:
            chosen = version if version is not None else the_lake.table(table).version()
            manifest = export_table_tokens(the_lake, table=table, version=chosen, release_name=release, progress=update,
                                           **options)
        else:
            manifest = export_tokens(the_lake, release, progress=update, **options)
    if as_json:
        print_json(manifest.to_dict())
        return
    out = console()
    info = manifest.tokenizer
    out.print(f"[bold green]tokenized {manifest.release}[/] ({manifest.table}@v{manifest.table_version}) to tier {tier}")
    out.print(f"  tokenizer  sha256 {info.sha256[:12]}  vocab {info.vocab_size}  eod {info.eod_token!r}={info.eod_id}")
    out.print(f"  files      {len(manifest.files)} x .bin/.idx/.ids  ({manifest.dtype})")
    out.print(f"  documents  {manifest.num_documents}")
    out.print(f"  tokens     {manifest.num_tokens}")
    out.print(f"  replicas   {', '.join(manifest.tiers)}")
