"""`datahub export RELEASE --lake L --tier TIER`: deterministic WebDataset shards + manifest on a tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from datahub.cli.lake_option import LAKE_HELP
from datahub.cli.output import console, print_json, progress


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export(
        release: str = typer.Argument(..., help="Release name (shards are named RELEASE-NNNNNN.tar)."),
        lake: str = typer.Option(..., "--lake", help=LAKE_HELP),
        tier: str = typer.Option(..., "--tier", help="Tier name from the storage config: e.g. cfs, ceph, hdfs."),
        storage: Path = typer.Option(Path("storage.yaml"), "--storage", help="Storage YAML (schemas/storage.example.yaml)."),
        shard_size: Optional[str] = typer.Option(None, "--shard-size", help="Target shard size, e.g. 256MB (default)."),
        shard_samples: Optional[int] = typer.Option(None, "--shard-samples", help="Samples per shard instead of a size."),
        shuffle_seed: Optional[int] = typer.Option(None, "--shuffle-seed", help="Seeded sample order (default: by sample_id)."),
        table: Optional[str] = typer.Option(None, "--table", help="Export this table version instead of a release record."),
        version: Optional[int] = typer.Option(None, "--version", help="Delta version of --table (default: latest)."),
        engine: str = typer.Option("local", "--engine", help="local (this process), ray or spark: engine tasks write "
                                   "whole shards straight to the tier; same bytes either way."),
        address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address or Spark master URL "
                                              "(default: an embedded local engine)."),
        workers: Optional[int] = typer.Option(None, "--workers", help="Engine tasks at once (default: the engine's)."),
        verify: bool = typer.Option(False, "--verify", help="On a tier that holds the release, check replicas by "
                                    "sha256 too (not only size) and rewrite damaged ones."),
        as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    ) -> None:
        """Export a release as byte-reproducible WebDataset shards; re-running resumes and skips verified shards."""
        from datahub.cli.lake_option import open_lake
        from datahub.export import export_release, export_table_version
        from datahub.storage import load_storage_config

        config = load_storage_config(storage)
        the_lake = open_lake(lake)
        if engine not in ("local", "ray", "spark"):
            raise typer.BadParameter(f"use local, ray or spark, got {engine!r}", param_hint="--engine")
        options: dict[str, Any] = {"tier": tier, "storage": config, "shard_size": shard_size, "shard_samples": shard_samples,
                   "shuffle_seed": shuffle_seed, "workers": workers, "verify": verify}
        running = None
        if engine != "local":
            from datahub.config.spec import EngineSpec
            from datahub.engines.registry import make_engine

            spec = EngineSpec(kind=engine, address=address) if engine == "ray" else EngineSpec(kind="spark", master=address)
            running = make_engine(spec)
            running.start()
            options["engine"] = running
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
