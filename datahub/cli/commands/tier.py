"""`datahub tier plan|apply`: place exported releases on tiers by the storage policy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from datahub.cli.lake_option import LAKE_HELP
from datahub.cli.output import console, plain, print_json, progress

if TYPE_CHECKING:
    from datahub.export.tiering import TierPlan
    from datahub.lake.lake import Lake
    from datahub.storage import StorageConfig

tier_app = typer.Typer(help="Move exported releases (text shards and token files) between storage tiers (cfs, ceph, "
                             "hdfs) by policy.",
                       no_args_is_help=True)


def _inputs(lake: str, storage: list[Path], release: list[str], tiers: Optional[str]
            ) -> tuple[Lake, StorageConfig, list[str] | None, dict[str, list[str]] | None]:
    from datahub.cli.lake_option import open_lake
    from datahub.errors import SpecError
    from datahub.storage import load_storage_config

    if not storage:
        storage = [Path("storage.yaml")]
    config = load_storage_config(storage[0])
    for extra in storage[1:]:  # a second region: its tiers join under their own names
        config = config.merged(load_storage_config(extra))
    if tiers is not None and not release:
        raise SpecError("--tiers needs --release NAME (which release to place on those tiers)")
    names = [t.strip() for t in (tiers or "").split(",") if t.strip()]
    if tiers is not None and not names:  # `--tiers "$TIERS"` with the variable unset: not "apply the policy"
        raise SpecError(f"--tiers {tiers!r} names no tier; give the tiers the release should be on, e.g. --tiers "
                        f"{','.join(list(config.tiers)[:2])}, or drop --tiers to apply the storage policy")
    targets = {name: names for name in release} if tiers is not None else None
    return open_lake(lake), config, (release or None), targets


def _rules(the_lake: Lake, config: StorageConfig, plan: TierPlan, targets: dict[str, list[str]] | None) -> dict[str, str]:
    """Per release with a move: the rule that placed it (a policy rule in words, or --tiers)."""
    from datahub.export.tiering import release_states
    from datahub.shards.manifest import read_lake_manifest
    from datahub.storage.policy import storage_class_rule

    names = sorted({m.release for m in plan.moves})
    rules = {name: "--tiers given on the command line" for name in names if targets and name in targets}
    by_policy = [name for name in names if name not in rules]
    # as the plan does: an export of a bare table version (no release record) dates from its manifest
    manifests = {name: manifest for name in by_policy if (manifest := read_lake_manifest(the_lake, name)) is not None}
    for name, state in release_states(the_lake, by_policy, manifests=manifests).items():
        klass, why = storage_class_rule(state, config.policy)
        rules[name] = f"class {klass}: {why}; policy.classes.{klass} = {config.policy.classes.get(klass)}"
    return rules


def _regions(config: StorageConfig) -> dict[str, str]:
    """The region label of each labelled tier (``region:`` in the storage YAML)."""
    return {name: spec.region for name, spec in config.tiers.items() if spec.region}


def _print_plan(plan: TierPlan, rules: dict[str, str] | None = None, regions: dict[str, str] | None = None) -> None:
    out = console()
    for k in plan.kept:
        out.print(plain(f"  {k.release}: kept {k.token_files} token files, {k.token_bytes} bytes on {k.tier} (a "
                        f"token-only replica; `tier apply --release {k.release} --tiers ...` without {k.tier} "
                        "removes them)"), soft_wrap=True)
    if not plan.moves:
        out.print("nothing to move: every release is where the policy wants it")
        return

    def at(tier: str | None) -> str:  # a tier with its region, when labelled: "ceph-eu (eu-west)"
        region = (regions or {}).get(tier or "")
        return f"{tier} ({region})" if region else str(tier)

    for m in plan.moves:
        what = {"copy": f"copy {at(m.source)} -> {at(m.tier)}",
                "repair": f"repair on {at(m.tier)} from {at(m.source)}"}.get(m.action, f"delete from {at(m.tier)}")
        extra = " (leftover of an interrupted apply)" if m.leftover else ""
        extra += " (token-only replica: --tiers leaves this tier out)" if m.token_only else ""
        extra += " (damaged or missing replicas)" if m.action == "repair" else ""
        rule = (rules or {}).get(m.release)
        tokens = f", {m.token_files} token files, {m.token_bytes} bytes" if m.token_files else ""
        out.print(plain(f"  {m.release}: {what}, {m.shards} shards, {m.bytes} bytes{tokens}"
                        + (f" [class {m.storage_class}]" if m.storage_class else "") + extra
                        + (f"; why: {rule}" if rule else "")), soft_wrap=True)
    out.print(f"total: copy {plan.bytes_to_copy} bytes, delete {plan.bytes_to_delete} bytes")


PLAN_EXAMPLES = """Examples:
  # what the policy would copy and delete, and how many bytes
  datahub tier plan --lake lake/ --storage storage.yaml
  datahub tier plan --lake lake/ --storage storage.yaml --release corpus-v1 \\
      --tiers cfs,ceph --json"""

APPLY_EXAMPLES = """Examples:
  datahub tier apply --lake lake/ --storage storage.yaml
  # a second region's tiers join from eu.yaml
  datahub tier apply --lake lake/ --storage storage.yaml --storage eu.yaml \\
      --release corpus-v1 --tiers cfs,ceph-eu --max-mb-s 200"""

TOUCH_EXAMPLES = """Examples:
  # from a training job's start-up: keeps the release on its hot tier
  datahub tier touch corpus-v1 --lake lake/ --reader pretrain-7b"""


REMOVE_EXAMPLES = """Examples:
  # take down an export after `datahub release redact corpus-v2 --from corpus-v1 ...`
  datahub tier remove --release corpus-v1 --reason "DMCA notice 2026-12-07" \\
      --lake lake/ --storage storage.yaml --json"""


def register(app: typer.Typer) -> None:
    app.add_typer(tier_app, name="tier")


_LAKE = typer.Option(..., "--lake", help=LAKE_HELP)
_STORAGE = typer.Option([], "--storage", help="Storage YAML; give it twice to add a second region's tiers.")
_RELEASE = typer.Option([], "--release", help="Only this release (repeatable).")
_VERIFY = typer.Option(False, "--verify", help="Check kept replicas by sha256 too (not only size).")
_TIERS = typer.Option(None, "--tiers", help="Override the policy: comma-separated tiers the --release should be on, "
                                            "its whole placement: token files exported to a tier not listed (a "
                                            "token-only replica) are copied to these tiers and removed there.")
_WORKERS = typer.Option(2, "--workers", min=1, help="Shards copied at once (each streamed 8 MiB at a time).")
_MAX_MB_S = typer.Option(None, "--max-mb-s", min=0.001,
                         help="Cap the reads (MB/s, all workers together): apply's source replicas and "
                              "read-back verify at the destination, and the --verify checks of plan and apply; "
                              "e.g. a cross-region link shared with other traffic.")


@tier_app.command("plan", epilog=PLAN_EXAMPLES)
def plan(lake: str = _LAKE, storage: list[Path] = _STORAGE, release: list[str] = _RELEASE,
         tiers: Optional[str] = _TIERS, as_json: bool = typer.Option(False, "--json", help="Print JSON."), verify: bool = _VERIFY,
         max_mb_s: Optional[float] = _MAX_MB_S) -> None:
    """Dry run: what would be copied and deleted, and how many bytes."""
    from datahub.export.tiering import plan_tiers

    the_lake, config, releases, targets = _inputs(lake, storage, release, tiers)
    result = plan_tiers(the_lake, storage=config, releases=releases, targets=targets, verify=verify,
                        max_bytes_per_s=max_mb_s * 1e6 if max_mb_s else None, drop_token_only=targets is not None)
    rules = _rules(the_lake, config, result, targets)
    regions = _regions(config)
    if as_json:
        print_json({**result.as_dict(), "rules": rules, "regions": regions})
        return
    _print_plan(result, rules, regions)


@tier_app.command("apply", epilog=APPLY_EXAMPLES)
def apply(lake: str = _LAKE, storage: list[Path] = _STORAGE, release: list[str] = _RELEASE,
          tiers: Optional[str] = _TIERS, as_json: bool = typer.Option(False, "--json", help="Print JSON."), verify: bool = _VERIFY,
          workers: int = _WORKERS, max_mb_s: Optional[float] = _MAX_MB_S) -> None:
    """Copy -> verify checksum at the destination -> update manifests -> delete sources. Safe to re-run.
    Token files (export --tokenizer) move with the release: copied to its new tiers, and deleted from a tier it
    leaves once each is verified by sha256 on another tier. Token files exported to a tier the text is not on (a
    token-only replica, e.g. a cfs tier for PackedDataset) stay there on policy runs; with --tiers (the release's
    whole placement) they are copied to those tiers and removed from a tier not listed, the same verified way.
    Kept replicas are checked (size; sha256 with --verify) and damaged ones copied again from an intact tier."""
    from datahub.export.tiering import TierPlan, apply_tiers, plan_tiers

    the_lake, config, releases, targets = _inputs(lake, storage, release, tiers)
    max_bytes_per_s = max_mb_s * 1e6 if max_mb_s else None
    result = plan_tiers(the_lake, storage=config, releases=releases, targets=targets, verify=verify,
                        max_bytes_per_s=max_bytes_per_s, drop_token_only=targets is not None)
    from datahub.cli.arguments import tier_answers

    for name in sorted({t for m in result.moves for t in (m.source, m.tier) if t}):  # the tiers it copies between
        tier_answers(config, name)
    with progress("tier apply", enabled=not as_json) as update:
        done = apply_tiers(the_lake, result, storage=config, progress=update, workers=workers,
                           max_bytes_per_s=max_bytes_per_s)
    if as_json:
        print_json({**TierPlan(tuple(done), result.kept).as_dict(), "regions": _regions(config)})
        return
    _print_plan(TierPlan(tuple(done), result.kept), regions=_regions(config))


@tier_app.command("touch", epilog=TOUCH_EXAMPLES)
def touch(release: str = typer.Argument(..., help="The release that was read."), lake: str = _LAKE,
          reader: Optional[str] = typer.Option(None, "--reader", help="Who read it (job name, host): kept with the event."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Record that a release was read today, so the policy keeps it hot (at most one event per release per day).

    Run it where a training job starts (or from rank 0): trainers usually hold read-only lake credentials,
    so the loader itself records nothing.
    """
    from datahub.release.events import record_read

    from datahub.cli.lake_option import open_lake

    recorded = record_read(open_lake(lake), release, reader=reader)
    if as_json:
        print_json({"release": release, "recorded": recorded})
        return
    console().print(f"read of {release} recorded" if recorded else f"read of {release} already recorded today")


@tier_app.command("remove", epilog=REMOVE_EXAMPLES)
def remove(release: str = typer.Option(..., "--release", help="The exported release to take down."),
           reason: str = typer.Option(..., "--reason", help="Why (DMCA notice, PII report): kept in its manifests and "
                                                            "shown to every trainer that opens it."),
           lake: str = _LAKE, storage: list[Path] = _STORAGE,
           as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Take an export down: mark its manifests withdrawn (reason, time; the lake's first, so the loader refuses it
    from then on), then delete its shards and token files from every tier. Safe to re-run: a killed run is finished,
    a finished one deletes nothing. `tier plan/apply` never place a withdrawn release again."""
    from datahub.export.tiering import remove_release

    the_lake, config, _, _ = _inputs(lake, storage, [release], None)
    done = remove_release(the_lake, release, reason=reason, storage=config)
    if as_json:
        print_json(done.as_dict())
        return
    out = console()
    out.print(plain(f"{release}: withdrawn at {done.withdrawn_at} ({done.reason})"), soft_wrap=True)
    for name, what in sorted(done.removed.items()):
        out.print(plain(f"  {name}: removed {what['files']} files, {what['bytes']} bytes"), soft_wrap=True)
    out.print(f"total: removed {done.files} files, {done.bytes} bytes" if done.files
              else "nothing to remove: no tier holds its files")
