"""The operator contract: the one core abstraction of datahub.

An operator has a ``name``, a ``version``, typed ``Params`` (a pydantic model) and one
method. A ``BatchOperator`` maps a ``pyarrow.Table`` to a ``pyarrow.Table`` and runs
unchanged on every engine (Ray ``map_batches``, Spark ``mapInArrow``). A
``GlobalOperator`` (dedup, connected components) needs to see all rows; it is written
once against the engine-neutral ``Frame`` interface (``datahub.engines.frame``).

Dropping is marking, never deleting: a batch operator returns every row it was given,
and marks the ones it drops with :meth:`Operator.mark_dropped`. The engine wrapper
(:func:`apply_batch_operator`) feeds an operator only the rows still alive and records
lineage events, so accounting (read = written + dropped + quarantined) always holds.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, ValidationError

from datahub.close_names import did_you_mean
from datahub.errors import MissingDependencyError, OperatorError

if TYPE_CHECKING:
    from datahub.engines.frame import Frame
    from datahub.lake.lake import Lake

# Envelope columns: travel with each row through the graph, never written to `samples`.
DROP_REASON = "_drop_reason"  # null while the row is alive
DROP_OP = "_drop_op"  # name@version of the operator that dropped it
DROP_REF = "_drop_ref"  # JSON string, e.g. {"dup_of": "...", "cluster_id": "..."}
EVENT_PREFIX = "_ev."  # one column per graph node: "modified" | "annotated" | null
ENVELOPE_COLUMNS = (DROP_REASON, DROP_OP, DROP_REF)


QUARANTINED = "_quarantined"  # true for records that could not be read (reader or ingest checks)


def is_envelope_column(name: str) -> bool:
    """Columns starting with ``_`` travel with rows through the graph but never reach ``samples``."""
    return name.startswith("_")


class Params(BaseModel):
    """Base of every operator's params: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


P = TypeVar("P", bound=BaseModel)


class Operator(Generic[P]):
    """Base class: name, version, typed params, optional dependencies checked at construction.

    Generic over its params model: ``class MyFilter(BatchOperator[MyParams])`` with ``Params = MyParams``
    types ``self.params`` as ``MyParams``.
    """

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    Params: ClassVar[type[BaseModel]] = Params  # the model P; a ClassVar cannot name a type variable
    params: P
    # (import name, pip requirement) pairs checked when the operator is built.
    requires: ClassVar[tuple[tuple[str, str], ...]] = ()
    # True: the operator adds signals to every row it sees (an "annotated" lineage event).
    annotates: ClassVar[bool] = False
    # The sample kinds (datahub.kinds) the operator can handle; the graph refuses to feed it others.
    kinds: ClassVar[frozenset[str]] = frozenset({"text"})

    def __init__(self, params: P | Mapping[str, Any] | None = None) -> None:
        self._check_requirements()
        validated = params if isinstance(params, BaseModel) else self.Params.model_validate(params or {})
        self.params = cast(P, validated)  # Params is P's model (see the class docstring)

    @classmethod
    def _check_requirements(cls) -> None:
        for module, requirement in cls.requires:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise MissingDependencyError(
                    f"operator {cls.name!r} needs the Python package {requirement!r} "
                    f"(import {module!r} failed: {exc}); install it with: pip install '{requirement}'"
                ) from exc

    @property
    def op_id(self) -> str:
        """``name@version``, the form lineage records."""
        return f"{self.name}@{self.version}"

    @property
    def params_hash(self) -> str:
        """A stable short hash of the params, recorded in lineage next to ``op_id``."""
        canonical = json.dumps(self.params.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @staticmethod
    def mark_dropped(
        table: pa.Table,
        mask: pa.Array | pa.ChunkedArray,
        reason: str | pa.Array,
        *,
        ref: pa.Array | None = None,
    ) -> pa.Table:
        """Mark rows where ``mask`` is true as dropped with ``reason`` (a string or per-row array).

        The engine wrapper fills in the operator id; rows already dropped keep their first reason.
        """
        mask = pc.fill_null(mask, False)
        n = table.num_rows
        reason_arr = pa.array([reason] * n, pa.string()) if isinstance(reason, str) else reason
        current = table.column(DROP_REASON) if DROP_REASON in table.column_names else pa.nulls(n, pa.string())
        new_reason = pc.if_else(pc.and_(mask, pc.is_null(current)), reason_arr, current)
        table = _set_column(table, DROP_REASON, new_reason)
        if ref is not None:
            current_ref = table.column(DROP_REF) if DROP_REF in table.column_names else pa.nulls(n, pa.string())
            table = _set_column(table, DROP_REF, pc.if_else(mask, ref, current_ref))
        return table


class OperatorContext(Protocol):
    """What a global operator may ask of the run it is part of (the pipeline's ``RunContext`` provides it).

    Kept narrow so the operator library depends on this contract, never on the orchestrator above it.
    """

    @property
    def run_id(self) -> str:
        """This run's id (the Delta app transaction of its commits; index rows record it)."""

    @property
    def job_name(self) -> str:
        """The job's name; its run ids are ``{job_name}-{12 hex}``."""

    @property
    def full(self) -> bool:
        """True under ``--full``: this job's earlier rows are being replaced, not extended."""

    @property
    def lake(self) -> Lake:
        """The lake, read for incremental indexes (rows of earlier runs)."""

    def from_arrow(self, table: pa.Table) -> Frame:
        """A frame on the run's engine holding ``table`` (small tables: it is built in the driver)."""

    def read_files(self, files: Sequence[Any], read: Callable[[Any], Iterator[pa.Table]]) -> Frame:
        """A frame on the run's engine: one task per file description, ``read`` yields its Arrow tables
        (e.g. the lake index files a dedup operator scans in its tasks, never whole in the driver)."""

    def add_side_output(self, table: str, data: Frame | pa.Table) -> None:
        """Rows for another lake table (e.g. ``minhash_index``), committed with the run after the samples."""

    def checkpoint(self, name: str) -> None:
        """A named point inside the operator where crash-safety tests may kill the process."""


class BatchOperator(Operator[P]):
    """A map, filter or annotate step: ``process(table) -> table`` with the same rows."""

    def process(self, table: pa.Table) -> pa.Table:  # pragma: no cover - interface
        raise NotImplementedError


class GlobalOperator(Operator[P]):
    """A step that needs all rows at once (dedup). Written against the engine-neutral Frame."""

    def apply(self, frame: Frame, context: OperatorContext) -> Frame:  # pragma: no cover - interface
        raise NotImplementedError


def add_quality_signals(table: pa.Table, signals: dict[str, pa.Array | pa.ChunkedArray]) -> pa.Table:
    """Add (or replace) fields of the ``quality`` struct column; other fields are kept."""
    fields: dict[str, pa.Array | pa.ChunkedArray] = {}
    if "quality" in table.column_names:
        quality = table.column("quality").combine_chunks()
        for i, field in enumerate(quality.type):
            fields[field.name] = quality.field(i)
    for name, values in signals.items():
        fields[name] = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    struct = pa.StructArray.from_arrays(list(fields.values()), names=list(fields))
    return _set_column(table, "quality", struct)


def _set_column(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)


def ensure_envelope(table: pa.Table) -> pa.Table:
    """Add the drop columns (all null) to a freshly ingested table."""
    for name in ENVELOPE_COLUMNS:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.string()))
    return table


def apply_batch_operator(operator: BatchOperator, table: pa.Table, *, node: str) -> pa.Table:
    """Run one batch operator on the live rows of ``table`` and record its lineage events.

    Engines call this inside ``map_batches`` / ``mapInArrow``; it is plain pyarrow.
    """
    table = ensure_envelope(table)
    alive_mask = pc.is_null(table.column(DROP_REASON))
    alive = table.filter(alive_mask)
    dead = table.filter(pc.invert(alive_mask))
    if alive.num_rows == 0:
        processed = alive
    else:
        processed = operator.process(alive)
        if processed.num_rows != alive.num_rows:
            raise OperatorError(
                f"operator {operator.op_id} (graph node {node!r}) returned {processed.num_rows} rows "
                f"for {alive.num_rows}: batch operators must keep every row and mark drops with "
                "mark_dropped(), so no sample is lost without a reason"
            )
        processed = ensure_envelope(processed)
    # Events: "dropped" is carried by the drop columns; here modified/annotated per node.
    newly_dropped = pc.is_valid(processed.column(DROP_REASON))
    drop_op = processed.column(DROP_OP) if DROP_OP in processed.column_names else pa.nulls(processed.num_rows, pa.string())
    drop_op = pc.if_else(pc.and_(newly_dropped, pc.is_null(drop_op)), pa.scalar(operator.op_id), drop_op)
    processed = _set_column(processed, DROP_OP, drop_op)
    event: pa.Array | pa.ChunkedArray
    if processed.num_rows and "text" in alive.column_names and "text" in processed.column_names:
        changed = pc.fill_null(pc.not_equal(alive.column("text"), processed.column("text")), True)
    else:
        changed = pa.array([False] * processed.num_rows)
    if operator.annotates:
        event = pc.if_else(changed, pa.scalar("modified"), pa.scalar("annotated"))
    else:
        event = pc.if_else(changed, pa.scalar("modified"), pa.scalar(None, pa.string()))
    processed = _set_column(processed, EVENT_PREFIX + node, event)
    if dead.num_rows:
        dead = _set_column(dead, EVENT_PREFIX + node, pa.nulls(dead.num_rows, pa.string()))
        # Columns an operator added (e.g. `quality`) are null for the dead rows.
        dead = dead.select([c for c in processed.column_names if c in dead.column_names])
        return pa.concat_tables([processed, dead], promote_options="permissive").select(processed.column_names)
    return processed


# ---- registry -------------------------------------------------------------------------

O = TypeVar("O", bound=type[Operator])
_REGISTRY: dict[str, type[Operator]] = {}


def register(cls: O) -> O:
    """Class decorator: make an operator available to job specs under ``cls.name``.

    Registering a second class under a taken name is an error, never a silent overwrite.
    """
    name = getattr(cls, "name", None)
    if not name or not isinstance(name, str):
        raise OperatorError(f"{cls.__qualname__} has no string `name`; set `name = '...'` on the class")
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise OperatorError(
            f"operator name {name!r} is taken by {existing.__module__}.{existing.__qualname__}; "
            f"rename {cls.__module__}.{cls.__qualname__}"
        )
    _REGISTRY[name] = cls
    return cls


def _load_library() -> None:
    # The operator library registers itself on import (one import per folder).
    importlib.import_module("operators")


def get_operator(name: str) -> type[Operator]:
    _load_library()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OperatorError(f"unknown operator {name!r}{did_you_mean(name, _REGISTRY)} "
                            f"(known: {', '.join(sorted(_REGISTRY))})") from None


def registered_operators() -> dict[str, type[Operator]]:
    _load_library()
    return dict(_REGISTRY)


def build_operator(name: str, params: dict[str, Any] | None) -> Operator:
    """Look up ``name`` and validate ``params``; raises pydantic's ValidationError on bad params."""
    return get_operator(name)(params)


__all__ = [
    "BatchOperator",
    "GlobalOperator",
    "Operator",
    "OperatorContext",
    "Params",
    "ValidationError",
    "apply_batch_operator",
    "build_operator",
    "get_operator",
    "register",
    "registered_operators",
    "Callable",
]
