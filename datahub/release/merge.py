"""``release.merge``: combine releases into a new one, deduplicated across them, optionally weighted.

Dedup (``release.merge_dedup``) is exact (the ``operators.dedup.exact`` content hash) by default
or near (the MinHash-LSH kernels of ``minhash_dedup``); the first copy wins, in ``--from`` order,
and each dropped row's lineage names its ``dup_of`` and the release that kept it. Nothing holds a
whole input: ids, keys and row numbers go through sorted runs spilled to local disk
(``lake.external_sort``), and the kept rows stream from the inputs into the new table's files.
Weights fix the mixture of the output: with per-source counts ``c`` (after dedup) and
normalized weights ``w``, the output has ``N = min(c_s / w_s)`` rows, ``floor(w_s * N)`` from
each source (no source is upsampled), picked by the smallest seeded hash of sample_id
(deterministic, order-independent). The rows are materialized in the Delta table
``release_<NEW>`` with a ``release_source`` column naming the input release of each row;
lineage records the same. Like ``release create``, a merge is refused when an input overlaps a registered eval set
(each input is checked before anything is written), unless the reason is given: it is then recorded in the release's
details and in the ``released`` lineage reason of each contaminated sample. An input whose frozen table version an
earlier release already checked clean against the same eval-set contents, n-gram size and matcher version is not
scanned again (``release.evalset_gate``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from datahub.errors import EvalSetsChangedError, ReleaseError
from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.scan import scan_batches
from datahub.lake.tables import LINEAGE
from datahub.progress import Progress, counted
from datahub.release.digest import id_keys
from datahub.release.evalset_gate import (NOTES, contamination_notes, no_notes, recorded_clean_checks,
                                          registered_digests)
from datahub.release.freeze import (PARAMS_KEY, check_key, freeze, params_text, refuse_other_allowance,
                                    refuse_other_try, refuse_taken, release_txn)
from datahub.release.materialize import commit_rows
from datahub.release.merge_dedup import (ROW, SOURCE_COLUMN, DedupMode, Duplicates, Inputs, RowCursor,
                                         exact_duplicates, near_duplicates)
from datahub.release.records import MATERIALIZED_PREFIX, Release, check_name, get_release, list_releases

if TYPE_CHECKING:  # the eval-set check (operators, pandas) is imported when a merge runs, not with the package
    from datahub.evalset.check import Contamination

MERGE_OP = "release.merge@1"


def parse_weights(text: str | None) -> dict[str, float] | None:
    """``"A=0.7,B=0.3"`` -> {"A": 0.7, "B": 0.3}."""
    if not text:
        return None
    weights: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ReleaseError(f"--weights {text!r}: expected NAME=WEIGHT pairs, e.g. --weights A=0.7,B=0.3")
    return weights


def _dropped_lineage(dups: Duplicates, new: str, ts: datetime) -> pa.Table:
    """One ``dropped`` lineage row per duplicate: dup_of, the keeper's release, the method's fields."""
    refs = [
        json.dumps({"dup_of": d, "dup_release": dr, "release": new, "from": s, "method": dups.method, **extra})
        for d, dr, s, extra in zip(dups.dup_of.to_pylist(), dups.dup_release.to_pylist(), dups.source.to_pylist(),
                                   dups.extra)
    ]
    return lineage_rows(dups.sample_id, run_id=release_txn(new), op=MERGE_OP, action="dropped", reason=dups.reason,
                        ref=pa.array(refs, pa.string()), ts=ts)


_DROP_ORDER = "_merge_drop"  # the order drops were found in: rows of one sample_id keep it, as a stable sort would
_DROPPED = LINEAGE.append(pa.field(_DROP_ORDER, pa.int64()))
DROP_RUN_ROWS = 16_384  # dropped lineage rows (~250 B each) sorted in memory at a time
DROP_READ_ROWS = 1_024  # read from each spilled run at a time


class _Drops:
    """The ``dropped`` lineage rows of the dedup, spilled as found to sorted runs on local disk (by sample_id, then
    finding order) and streamed back to ``freeze`` in that order: nothing per drop stays in memory."""

    def __init__(self, new: str, ts: datetime) -> None:
        self.new = new
        self.ts = ts
        self.count = 0
        self.method: str | None = None  # of the dedup
        self.kept = 0  # rows the dedup kept, before --weights
        self.quotas: dict[str, int] | None = None  # of --weights
        self.runs = SortedRuns(_DROPPED, "sample_id", order=_DROP_ORDER, distinct=False, run_rows=DROP_RUN_ROWS,
                               read_rows=DROP_READ_ROWS)

    def __enter__(self) -> _Drops:
        return self

    def __exit__(self, *exc: object) -> None:
        self.runs.close()

    def add(self, dups: Duplicates) -> None:
        rows = _dropped_lineage(dups, self.new, self.ts)
        order = pa.array(np.arange(self.count, self.count + rows.num_rows, dtype=np.int64))
        self.runs.add(rows.append_column(_DROP_ORDER, order))
        self.count += rows.num_rows

    def lineage(self) -> Iterator[pa.Table]:
        """The rows sorted by sample_id (read once)."""
        for block in self.runs.merged():
            yield block.drop_columns([_DROP_ORDER])


def _check_weights(weights: dict[str, float], sources: list[str]) -> dict[str, float]:
    """The normalized share of each input release."""
    unknown = sorted(set(weights) - set(sources))
    missing = [s for s in sources if s not in weights]
    if unknown or missing:
        raise ReleaseError(f"--weights must name each --from release exactly: unknown {unknown}, missing {missing}")
    odd = [f"{s}={w}" for s, w in weights.items() if not (math.isfinite(w) and w >= 0)]
    if odd:  # NaN passed both checks below and failed after the whole dedup pass
        raise ReleaseError(f"--weights {','.join(odd)}: weights must be finite numbers >= 0, "
                           f"e.g. --weights A=0.7,B=0.3")
    if sum(weights.values()) <= 0:
        raise ReleaseError(f"--weights {weights}: weights must be >= 0 and not all 0")
    total = sum(weights.values())
    return {s: weights[s] / total for s in sources}


ROW_BATCH_ROWS = 2048  # whole rows read and written at a time (delta-rs buffers a row group)
_ROWS = pa.schema([(ROW, pa.int64())])
_SAMPLE_KEYS = pa.schema([("sample_key", pa.uint64()), (ROW, pa.int64())])


class _Kept:
    """The rows the dedup keeps, given in any order: counted per input release, sampled by ``--weights``
    (``digest.id_keys``), then handed back in row order, all through spilled sorted runs."""

    def __init__(self, sources: list[str], share: dict[str, float] | None, seed: int) -> None:
        self.sources = sources
        self.share = share
        self.seed = seed
        self.counts = np.zeros(len(sources), dtype=np.int64)
        self.by_row = SortedRuns(_ROWS, ROW)
        # per input: (seeded key, row) of its kept rows, every row, sorted by key then row (ties: row order)
        self.by_key = [SortedRuns(_SAMPLE_KEYS, "sample_key", order=ROW, distinct=False) for _ in sources] if share else []

    def __enter__(self) -> _Kept:
        return self

    def __exit__(self, *exc: object) -> None:
        for runs in [self.by_row, *self.by_key]:
            runs.close()

    def add(self, rows: np.ndarray, inputs: np.ndarray, sample_ids: pa.Array) -> None:
        self.counts += np.bincount(inputs, minlength=len(self.sources))
        if not self.share:
            self.by_row.add(pa.table([pa.array(rows, pa.int64())], schema=_ROWS))
            return
        keys = id_keys(sample_ids, seed=self.seed)
        for index in np.unique(inputs):
            mine = inputs == index
            self.by_key[index].add(pa.table([pa.array(keys[mine]), pa.array(rows[mine], pa.int64())],
                                            schema=_SAMPLE_KEYS))

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def chosen(self) -> tuple[Iterator[pa.Table], dict[str, int] | None]:
        """The rows to write, in row order (blocks of ``ROW``), and the quotas of ``--weights``.

        With weights ``w`` (normalized) and per-input counts ``c`` after dedup, ``N = min(c_s / w_s)`` rows,
        ``floor(w_s * N)`` from each input: its rows of the smallest seeded keys of sample_id."""
        if not self.share:
            return self.by_row.merged(), None
        share, sources = self.share, self.sources
        counts = dict(zip(sources, self.counts.tolist()))
        empty = [s for s in sources if share[s] > 0 and counts[s] == 0]
        if empty:
            raise ReleaseError(f"--weights: release(s) {empty} have no rows left after cross-release dedup, so no "
                               "mixture with those weights exists; give them weight 0 or merge with --no-dedup")
        size = min(counts[s] / share[s] for s in sources if share[s] > 0)
        quotas = {s: int(np.floor(share[s] * size + 1e-9)) for s in sources}
        for source, runs in zip(sources, self.by_key):
            left = quotas[source]
            for block in runs.merged():
                if left <= 0:
                    break
                taken = block.slice(0, left)
                self.by_row.add(taken.select([ROW]))
                left -= taken.num_rows
            runs.close()
        return self.by_row.merged(), quotas


def _merged_schema(datasets: list[Any]) -> pa.Schema:
    schemas = [pa.schema(dataset.schema) for dataset in datasets]
    schemas = [s.remove(s.get_field_index(SOURCE_COLUMN)) if SOURCE_COLUMN in s.names else s for s in schemas]
    return pa.unify_schemas([*schemas, pa.schema([(SOURCE_COLUMN, pa.string())])], promote_options="permissive")


def _kept_rows(parents: list[Release], datasets: list[Any], chosen: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """Every column of the ``chosen`` rows (blocks of row numbers, ascending), input release by input release, in
    batches, in input order. Only pyarrow scans here (``datasets`` are opened before the commit), each file read
    without read-ahead."""
    schema = _merged_schema(datasets)
    cursor = RowCursor(chosen, _ROWS)
    first = 0
    for parent, dataset in zip(parents, datasets):
        for batch in scan_batches(dataset, batch_rows=ROW_BATCH_ROWS):
            n = batch.num_rows
            positions = cursor.take(first, first + n).column(ROW).to_numpy() - first
            first += n
            if not len(positions):
                continue
            rows = pa.Table.from_batches([batch]).take(pa.array(positions))
            if SOURCE_COLUMN in rows.column_names:  # merging a merge: the original input release is replaced
                rows = rows.drop_columns([SOURCE_COLUMN])
            rows = rows.append_column(SOURCE_COLUMN, pa.repeat(parent.name, rows.num_rows).cast(pa.string()))
            yield pa.table([rows.column(f.name).cast(f.type) if f.name in rows.column_names else
                            pa.nulls(rows.num_rows, f.type) for f in schema], schema=schema)


def merge_releases(
    lake: Lake,
    new: str,
    *,
    sources: list[str],
    weights: dict[str, float] | None = None,
    dedup: DedupMode = "exact",
    threshold: float = 0.8,
    verify: bool = True,
    seed: int = 0,
    creator: str | None = None,
    allow_contamination: str | None = None,
    progress: Progress | None = None,
) -> Release:
    """Merge releases ``sources`` into release ``new`` (rows materialized in ``release_<new>``).

    ``dedup``: ``exact`` (normalized content hash), ``near`` (MinHash-LSH at Jaccard ``threshold``,
    each drop confirmed by exact shingle Jaccard unless ``verify=False``) or ``none``. Every pass streams the
    inputs in batches; what is held is bounded (``release.merge_dedup`` says what grows: for ``near``, a few bytes
    per row that shares a band key with another row); the drops' lineage rows are spilled as found and streamed
    to ``freeze``. ``progress(stage, done, total)`` gets the rows of each pass over the inputs, of the rows written,
    then ``freeze``'s.

    A merge is a new release, so it passes ``release create``'s eval-set gate: before anything is written, each
    input's frozen table version is checked (``evalset.check.contamination``, streamed); an overlap refuses the merge
    unless ``allow_contamination`` gives the reason, recorded in ``details["contamination"]`` (eval sets registered
    after an input release was created would otherwise leak into the merge). An eval set registered while the rows are
    written refuses the merge before its record is committed (``freeze``; run it again).
    """
    if allow_contamination is not None and not allow_contamination.strip():
        raise ReleaseError("--allow-contamination needs a reason (it is recorded in the release), e.g. "
                           '--allow-contamination "eval set is the held-out split, not the one we score on"')
    check_name(new)
    refuse_taken(lake, new)
    if len(sources) < 1 or len(set(sources)) != len(sources):
        raise ReleaseError(f"merge {new!r}: give each input release once with --from (got {sources})")
    if dedup not in ("exact", "near", "none"):
        raise ReleaseError(f"--dedup {dedup!r}: expected exact, near or none")
    share = _check_weights(weights, sources) if weights else None
    params: dict[str, Any] = {"kind": "merge", "sources": sources, "dedup": dedup, "seed": seed,
                              "weights": {s: float(w) for s, w in weights.items()} if weights else None}
    if dedup == "near":
        params.update(threshold=threshold, verify=verify)
    # allow_contamination is not a param: it changes no row, and a merge killed before its record must be able to
    # finish with it once an eval set registered since then overlaps an input (the reason goes to details, and to the
    # samples' lineage: freeze compares it with what a first try's lineage says)
    refuse_other_try(lake, new, MATERIALIZED_PREFIX + new, params, fix=_FIX)
    refuse_other_allowance(lake, new, allow_contamination)
    parents = [get_release(lake, s) for s in sources]
    with SortedRuns(NOTES, "sample_id") as notes:
        contamination = _contamination_gate(lake, new, parents, allow_contamination, notes, progress=progress)
        return _merged(lake, new, parents, params, share=share, weights=weights, seed=seed, dedup=dedup,
                       threshold=threshold, verify=verify, creator=creator, contamination=contamination,
                       allow_contamination=allow_contamination,
                       notes=notes.merged() if contamination and contamination["contaminated"] else None,
                       progress=progress)


def _merged(lake: Lake, new: str, parents: list[Release], params: dict[str, Any], *, share: dict[str, float] | None,
            weights: dict[str, float] | None, seed: int, dedup: DedupMode, threshold: float, verify: bool,
            creator: str | None, contamination: dict[str, Any] | None, allow_contamination: str | None,
            notes: Iterator[pa.Table] | None, progress: Progress | None) -> Release:
    """The merge past its gate: rows written to ``release_<new>``, then ``freeze`` (``notes``: the allowed
    contamination of each contaminated sample, for its ``released`` reason)."""
    sources = [p.name for p in parents]
    ts = datetime.now(timezone.utc)
    table = MATERIALIZED_PREFIX + new
    datasets = [lake.dataset(p.table, p.version) for p in parents]
    inputs = Inputs(sources, datasets, progress=progress, total=sum(p.row_count for p in parents))
    with _Drops(new, ts) as drops:
        _merge_rows(lake, new, parents, datasets, inputs, drops, share=share, seed=seed, dedup=dedup,
                    threshold=threshold, verify=verify, params=params)
        version = int(lake.table(table).version())
        details: dict[str, Any] = {
            "sources": sources, "rows_read": dict(zip(sources, inputs.counts or [])), "dedup": dedup,
            "dedup_method": drops.method, "duplicates_removed": inputs.rows - drops.kept,
            "duplicates_dropped": drops.count, "weights": weights, "seed": seed, "quotas": drops.quotas}
        if dedup == "near":
            details.update(threshold=threshold, verify=verify)
        if contamination is not None:
            details["contamination"] = contamination
        # the released ids and reasons are scanned back from the written table, in its (input) order; the dropped
        # rows' lineage streams back from the spilled runs
        return freeze(
            lake, new, table=table, version=version, kind="merge", qa_status="inherited", parents=sources,
            creator=creator, details=details, extra_lineage=drops.lineage(), reason_column=SOURCE_COLUMN,
            reason_prefix="merged_from:", released_notes=notes,
            allow_contamination=allow_contamination, contamination_check=_check_key(contamination),
            evalset_digests=_checked_digests(contamination),
            run_ids=sorted({r for p in parents for r in p.run_ids}), jobs=sorted({j for p in parents for j in p.jobs}),
            params=params, fix=_FIX, progress=progress,
        )


_FIX = "the same --from, --weights, --dedup, --seed, --threshold"


def _check_key(contamination: dict[str, Any] | None) -> str | None:
    """``freeze.check_key`` of the gate's checks of every input (one set of registered eval sets, one n-gram size,
    one matcher version)."""
    if contamination is None:
        return None
    checks = list((contamination.get("releases") or {}).values())
    digests = {name: digest for check in checks for name, digest in (check.get("evalset_digests") or {}).items()}
    return check_key(digests, int(checks[0].get("ngram") or 0) if checks else 0,
                     checks[0].get("matcher") if checks else None)


def _checked_digests(contamination: dict[str, Any] | None) -> dict[str, str]:
    """``name@version`` -> digest of the eval sets the gate checked every input against ({}: none registered)."""
    checks = list(((contamination or {}).get("releases") or {}).values())
    return {name: digest for check in checks for name, digest in (check.get("evalset_digests") or {}).items()}


def _contamination_gate(lake: Lake, new: str, parents: list[Release], allowed: str | None, notes: SortedRuns, *,
                        progress: Progress | None) -> dict[str, Any] | None:
    """``release create``'s eval-set check on each input's frozen table version: refused on any overlap unless
    ``allowed`` gives the reason; what to record in ``details["contamination"]`` (None when no eval set is
    registered, as create records nothing then). The contaminated samples stream into ``notes`` (sample_id, the
    lineage note ``contamination allowed: REASON (evalset@version:item)``, create's reason); an input an earlier
    release checked clean at the same table version against the same eval-set versions is not scanned again
    (``recorded_by`` names that release)."""
    from datahub.evalset.check import contamination

    recorded = recorded_clean_checks(lake, parents)
    found: dict[str, Contamination] = {}
    done = 0
    total = sum(p.row_count for p in parents if p.name not in recorded)

    def checked(rows: int) -> None:  # contamination's progress (rows of a batch) as one bar over every input
        nonlocal done
        done += rows
        if progress is not None:
            progress("eval-set check", done, total)

    for parent in parents:
        if parent.name not in recorded:
            found[parent.name] = contamination(lake, table=parent.table, version=parent.version, progress=checked,
                                               hits=contamination_notes(notes, allowed) if allowed is not None
                                               else no_notes)
    dirty = {name: f for name, f in found.items() if f.count}
    if dirty and allowed is None:
        described = "\n".join(f"--from release {name!r}: {f.describe()}" for name, f in dirty.items())
        raise ReleaseError(
            f"release {new!r} refused: {described}\n"
            "a merge is a new release and must not leak an eval set: take them out of that input release with "
            f"`datahub release redact NEW --from RELEASE --ids-file IDS --reason ... --lake {lake.ref}` (every id, "
            f"to the file IDS: `datahub evalset check --release RELEASE --ids-out IDS --lake {lake.ref}`) and merge "
            "the redacted one, or "
            'merge anyway with --allow-contamination "REASON" (recorded in the release and its lineage)'
        )
    checks = {p.name: recorded[p.name] if p.name in recorded else {**found[p.name].as_dict(), "digest": p.digest}
              for p in parents}
    registered = registered_digests(lake)  # one registered while the inputs were checked was checked by none of them
    stale = sorted(name for name, check in checks.items() if (check.get("evalset_digests") or {}) != registered)
    if registered and stale:
        changed = sorted(name for name in registered if any((checks[s].get("evalset_digests") or {}).get(name)
                                                            != registered[name] for s in stale))
        raise EvalSetsChangedError(
            f"release {new!r} refused: eval set(s) {', '.join(changed) or 'removed'} registered while the inputs were "
            f"checked: the rows of {', '.join(stale)} were not checked against them. "
            "Nothing was written: run the same command again (it checks every input against the eval sets "
            "registered then)")
    evalsets = sorted({s for check in checks.values() for s in check["evalsets"]})
    if not evalsets:
        return None
    by_evalset: dict[str, int] = {}
    for f in found.values():
        for name, count in f.by_evalset.items():
            by_evalset[name] = by_evalset.get(name, 0) + count
    contaminated = sum(f.count for f in found.values())
    return {"evalsets": evalsets, "rows_checked": sum(check["rows_checked"] for check in checks.values()),
            "by_evalset": by_evalset, "contaminated": contaminated, "releases": checks,
            "allowed": allowed if contaminated else None}


def _merge_rows(lake: Lake, new: str, parents: list[Release], datasets: list[Any], inputs: Inputs, drops: _Drops,
                *, share: dict[str, float] | None, seed: int, dedup: DedupMode, threshold: float,
                verify: bool, params: dict[str, Any]) -> None:
    """The dedup (drops to ``drops``) and the sampling, then the kept rows written to ``release_<new>``."""
    with _Kept(inputs.names, share, seed) as kept:
        if dedup == "exact":
            drops.method = exact_duplicates(inputs, kept.add, drops.add)
        elif dedup == "near":
            drops.method = near_duplicates(inputs, kept.add, drops.add, threshold=threshold, verify=verify)
        else:
            for index, first, batch in inputs.batches(["sample_id"]):
                kept.add(np.arange(first, first + batch.num_rows, dtype=np.int64),
                         np.full(batch.num_rows, index), batch.column("sample_id"))
        drops.kept = kept.total
        chosen, drops.quotas = kept.chosen()
        # written here and committed as add actions: delta-rs's writer buffers up to a target-size file of rows
        written = sum(drops.quotas.values()) if drops.quotas else kept.total
        rows = counted(_kept_rows(parents, datasets, chosen), inputs.progress, "write", total=written, rows=len)
        commit_rows(lake, MATERIALIZED_PREFIX + new, rows, txn=release_txn(new),
                    schema=_merged_schema(datasets), row_group_rows=ROW_BATCH_ROWS,
                    metadata={"datahub.release": new, PARAMS_KEY: params_text(params)})
