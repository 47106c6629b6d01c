"""The eval-set gate shared by ``release create``, ``merge`` and ``redact``: recorded checks read back, notes.

A release records its eval-set check in ``details["contamination"]`` (``evalset.check.Contamination.as_dict``; a
merge per input under ``releases``). A recorded check stands for a new one only when nothing its verdict depends on
changed: the same rows (table, version, row count, digest of sample ids), the same eval-set contents (the digests of
every set registered now), the same n-gram size and the same matcher (``ngrams.MATCHER_VERSION``: the text
normalization and n-gram hashing that decide a match; ``ngrams.SAME_ON_TEXT_TABLES``: older versions that match a
table without conversation columns as today's). The eval sets a release's rows were checked against are compared with
those registered again right before its lineage and its record are committed (``refuse_evalsets_since``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import EvalSetsChangedError
from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.progress import Progress
from datahub.release.records import Release, list_releases


def registered_digests(lake: Lake) -> dict[str, str]:
    """``name@version`` -> content digest of the latest version of every registered eval set (what a check now reads)."""
    from datahub.evalset.registry import list_evalsets

    return {f"{s.name}@{s.version}": s.digest for s in list_evalsets(lake)}


def refuse_evalsets_since(lake: Lake, name: str, checked_against: dict[str, str], *, written: bool = False) -> None:
    """Refuse release ``name`` (``EvalSetsChangedError``: retryable) when the eval sets registered now are not
    ``checked_against`` (``name@version`` -> digest: those its rows were checked against): one was registered since
    they were checked, so nobody checked them against it. ``written``: its rows (and lineage) are committed, its
    record is not; the same command finishes it (``freeze`` repairs a release whose record is missing)."""
    registered = registered_digests(lake)
    if registered == checked_against:
        return
    changed = sorted(key for key in registered if checked_against.get(key) != registered[key])
    state = ("Its rows are written but its release record is not (nothing ships without it)" if written
             else "Nothing was written")
    raise EvalSetsChangedError(
        f"release {name!r} refused: eval set(s) {', '.join(changed) or 'removed'} registered since its rows were "
        f"checked against [{', '.join(sorted(checked_against)) or 'no eval set'}] only. {state}: run the same "
        "command again (it checks the rows against every eval set registered then)")


def same_basis(checks: Iterable[dict[str, Any]], registered: dict[str, str], *, text_only: bool = False) -> bool:
    """Whether each of ``checks`` (recorded check dicts; a merge's: one per input) was made against exactly the
    eval-set contents ``registered`` now, with today's n-gram size and matcher: a check made now would match the same
    samples of the same rows. Per check, never their union: one input checked against {A} and another against
    {A, B} is not a check of both against {A, B}. ``text_only``: the checked rows have no conversation columns
    (``text_only_rows``), so a check by a matcher that matches such rows as today's does stands too."""
    checks = list(checks)
    return bool(checks) and bool(registered) and all(
        basis_change(check, registered, text_only=text_only) is None for check in checks)


def text_only_rows(lake: Lake, release: Release) -> bool:
    """Whether the frozen table of ``release`` has none of the conversation columns the matcher builds views from
    (``operators.decontam.views.VIEW_COLUMNS``): a check of it by a matcher in ``ngrams.SAME_ON_TEXT_TABLES`` matched
    what today's would."""
    from operators.decontam.views import VIEW_COLUMNS

    names = set(lake.dataset(release.table, release.version).schema.names)
    return not names & set(VIEW_COLUMNS)


def basis_change(check: dict[str, Any], registered: dict[str, str], *, text_only: bool = False) -> str | None:
    """Why a check made now against ``registered`` could find other samples than the recorded ``check`` did (for
    people: the eval sets, the matcher or the n-gram size changed), or None when it could not. ``text_only``: see
    ``same_basis``."""
    from operators.decontam import ngrams

    matcher = check.get("matcher")
    if matcher is None:
        return ("its check records no matcher version (made by a datahub from before the version was recorded, so "
                "whether today's matcher finds the same samples is unknown)")
    if matcher != ngrams.MATCHER_VERSION and not (text_only and matcher in ngrams.SAME_ON_TEXT_TABLES):
        return f"its check was made by matcher version {matcher}, this datahub's is {ngrams.MATCHER_VERSION}"
    if check.get("ngram") != ngrams.DEFAULT_NGRAM:
        return f"its check used {check.get('ngram')}-grams, this datahub uses {ngrams.DEFAULT_NGRAM}-grams"
    digests = check.get("evalset_digests") or {}
    if digests != registered:
        return (f"it was checked against eval sets [{', '.join(sorted(digests))}], registered now: "
                f"[{', '.join(sorted(registered)) or 'none'}]")
    return None


def recorded_clean_checks(lake: Lake, parents: list[Release], registered: dict[str, str] | None = None
                          ) -> dict[str, dict[str, Any]]:
    """Input release name -> the eval-set check an earlier release recorded (its ``details["contamination"]``) of the
    same rows: that input's frozen table at the same version, row count and digest of sample ids (content hashes);
    with no contaminated sample; against exactly the eval-set versions registered now, by content digest; with the
    same n-gram size and matcher version (``recorded_by``: that release). Only clean checks: a contaminated input is
    scanned again for its ids. ``registered``: the eval sets registered now, when the caller read them already."""
    registered = registered_digests(lake) if registered is None else registered
    if not registered:
        return {}
    wanted = {(p.table, p.version, p.row_count, p.digest): p.name for p in parents}
    text_only = {p.name: text_only_rows(lake, p) for p in parents}
    out: dict[str, dict[str, Any]] = {}
    for release in list_releases(lake):
        recorded = release.details.get("contamination") or {}
        own = release.digest if (recorded.get("table"), recorded.get("version")) == (release.table, release.version) \
            else None  # a create's (or redact's) check of the version it froze as it is
        for check, digest in [(recorded, own), *((c, c.get("digest")) for c in (recorded.get("releases") or {}).values())]:
            name = wanted.get((check.get("table"), check.get("version"), check.get("rows_checked"), digest))
            if (name is not None and name not in out and check.get("evalsets") == sorted(registered)
                    and same_basis([check], registered, text_only=text_only[name])
                    and check.get("contaminated") == 0):
                out[name] = {**{k: v for k, v in check.items() if k not in ("allowed", "recorded_by")},
                             "digest": digest, "recorded_by": check.get("recorded_by", release.name)}
    return out


def allowed_of(release: Release, registered: dict[str, str], *, text_only: bool = False) -> str | None:
    """The reason ``release`` was let out with although its samples overlap eval sets (``--allow-contamination``),
    when its recorded check (a merge: every input's) was made against the eval-set contents ``registered`` with
    today's n-gram size and matcher; else None. Then a check of any subset of its rows against ``registered`` finds a
    subset of what that check found, which the reason already covers (``release redact`` carries it)."""
    recorded = release.details.get("contamination") or {}
    allowed = recorded.get("allowed")
    if not allowed:
        return None
    return str(allowed) if same_basis(_checks_of(recorded), registered, text_only=text_only) else None


def not_carried(release: Release, registered: dict[str, str], *, text_only: bool = False) -> str | None:
    """For a refusal: ``release`` was let out with ``--allow-contamination REASON`` but the reason does not carry over
    to a check against ``registered`` (``allowed_of`` is None), why, and the fix; None when it had no such reason."""
    recorded = release.details.get("contamination") or {}
    allowed = recorded.get("allowed")
    if not allowed:
        return None
    checks = _checks_of(recorded)
    why = next((change for check in checks
                if (change := basis_change(check, registered, text_only=text_only)) is not None),
               None if registered else "no eval set is registered now")
    if why is None:
        return None
    return (f"release {release.name!r} was released with --allow-contamination {json.dumps(str(allowed))} against "
            f"[{', '.join(recorded.get('evalsets') or [])}]; that reason does not carry over: {why}; if it still "
            f"holds for these samples, give it again: --allow-contamination {json.dumps(str(allowed))}")


def _checks_of(recorded: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks a release's ``details["contamination"]`` records: one per input of a merge, else itself."""
    return list((recorded.get("releases") or {}).values()) or [recorded]


NOTES = pa.schema([("sample_id", pa.string()), ("note", pa.string())])  # freeze's released_notes


def contamination_notes(notes: SortedRuns, allowed: str) -> Callable[[pa.Table], None]:
    """A ``contamination(hits=)`` sink that adds each contaminated sample's lineage note to ``notes``:
    ``contamination allowed: REASON (evalset@version:item)`` (the ``released`` reason create and merge give it)."""
    def add(hits: pa.Table) -> None:
        text = pc.binary_join_element_wise(f"contamination allowed: {allowed} (", hits.column("ref"), ")", "")
        notes.add(pa.table([hits.column("sample_id"), text], schema=NOTES))

    return add


def no_notes(hits: pa.Table) -> None:
    """No notes to write (the release is refused, or nothing was found): ``contamination`` keeps examples only."""


def rows_done(progress: Progress, stage: str, total: int | None) -> Callable[[int], None]:
    """A ``progress(rows in a batch)`` callback (``contamination``'s) as ``progress(stage, rows done, total)``."""
    done = 0

    def batch_done(rows: int) -> None:
        nonlocal done
        done += rows
        progress(stage, done, total)

    return batch_done


NOTHING_TO_CHECK = "no eval set registered"  # a redact's ``details["evalset_gate"]`` when it had nothing to check against


def evalset_verdict(release: Release) -> dict[str, Any]:
    """What the eval-set gate decided for ``release``, from its record: ``verdict`` ``clean``, ``allowed`` (samples
    overlap eval sets, let out with the reason ``allowed``) or ``not_checked`` (``why_not_checked``: no eval set was
    registered when it was made, or a datahub from before the gate covered its kind made it: ``datahub evalset check
    --release NAME`` checks it now); the eval sets, the contaminated count, the inputs whose rows were read
    (``read``) and those whose recorded check was taken instead (``reused``: input -> the release that recorded it),
    and where an allowance carried over from (``carried_from``). The same keys for every verdict (null where they do
    not apply), so a script reads any of them from any release."""
    recorded = release.details.get("contamination")
    if not recorded:
        gated = release.kind != "redact" or release.details.get("evalset_gate") == NOTHING_TO_CHECK
        why = ("no eval set registered when it was made" if gated else
               "made before redacts were gated: the rows it kept were never checked, whatever was registered then")
        return {"verdict": "not_checked", "evalsets": [], "contaminated": None, "by_evalset": None,
                "rows_checked": None, "allowed": None, "reused": None, "read": None, "carried_from": None,
                "why_not_checked": why}
    contaminated = int(recorded.get("contaminated") or 0)
    checks = recorded.get("releases") or {release.name: recorded}
    reused = {name: check["recorded_by"] for name, check in checks.items() if check.get("recorded_by")}
    return {"verdict": "allowed" if contaminated else "clean", "evalsets": recorded.get("evalsets", []),
            "contaminated": contaminated, "by_evalset": recorded.get("by_evalset", {}),
            "rows_checked": recorded.get("rows_checked"), "allowed": recorded.get("allowed"), "reused": reused,
            "read": sorted(name for name in checks if name not in reused),
            "carried_from": recorded.get("carried_from"), "why_not_checked": None}


def describe_verdict(verdict: dict[str, Any], name: str) -> str:
    """``evalset_verdict`` of release ``name`` in one line for people."""
    if verdict["verdict"] == "not_checked":
        return f"not checked ({verdict['why_not_checked']}); check now: datahub evalset check --release {name}"
    sets = ", ".join(verdict["evalsets"])
    reused = verdict.get("reused") or {}
    read = verdict.get("read") or []
    if reused and read:  # a merge: some inputs read, others covered by a recorded check
        taken = "; ".join(f"{source}: the check recorded by {by}, not read again"
                          for source, by in sorted(reused.items()))
        how = f" (rows of {', '.join(read)} read; {taken})"
    elif reused:
        how = f" (the check recorded by {', '.join(sorted(set(reused.values())))}: rows not read again)"
    else:
        how = ""
    if verdict["verdict"] == "clean":
        return f"clean: {verdict['rows_checked']} rows share no n-gram with {sets}{how}"
    counts = ", ".join(f"{name}: {n}" for name, n in sorted((verdict.get("by_evalset") or {}).items()))
    carried = f" (carried from release {verdict['carried_from']})" if verdict.get("carried_from") else ""
    return (f"{verdict['contaminated']} sample(s) overlap eval sets [{counts}], allowed: {verdict['allowed']!r}"
            f"{carried}")
