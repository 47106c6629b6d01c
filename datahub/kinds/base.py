"""The kind registry: :class:`KindSpec` and the functions over it (see ``datahub.kinds``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import SpecError
from datahub.kinds.names import DEFAULT_KIND, KIND_COLUMN, KINDS

SampleIds = Callable[[pa.Table], pa.Array]
Members = Callable[[pa.Table], dict[str, pa.Array]]


@dataclass(frozen=True)
class KindSpec:
    name: str
    fields: tuple[pa.Field, ...]
    sample_ids: SampleIds
    description: str
    members: Members | None = None  # export: extension -> bytes per row (null: no member for that row)
    member_columns: tuple[str, ...] = ()  # columns written as members by ``members``, left out of ``.json``
    id_fields: tuple[pa.Field, ...] = ()  # columns a reader hands to ``sample_ids`` only; never stored in the lake


_REGISTRY: dict[str, KindSpec] = {}


def register_kind(spec: KindSpec) -> KindSpec:
    """Register a kind's spec; a kind not in ``KINDS`` or registered twice is an error."""
    if spec.name not in KINDS:
        raise SpecError(f"sample kind {spec.name!r} is not one of {', '.join(KINDS)}; add it to datahub/kinds/names.py")
    existing = _REGISTRY.get(spec.name)
    if existing is not None and existing is not spec:
        raise SpecError(f"sample kind {spec.name!r} is registered twice")
    for field in (*spec.fields, *spec.id_fields):
        if field.name == KIND_COLUMN or field.name in ("sample_id", "text", "meta", "source_uri"):
            raise SpecError(f"sample kind {spec.name!r}: field {field.name!r} is a column every kind shares")
    _REGISTRY[spec.name] = spec
    return spec


def kind_spec(name: str) -> KindSpec:
    """The spec of kind ``name``; a clear error for an unknown kind or one with no implementation here."""
    if name not in KINDS:
        raise SpecError(f"unknown sample kind {name!r}; known: {', '.join(KINDS)}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SpecError(f"sample kind {name!r} has no implementation in this version of datahub "
                        f"(implemented: {', '.join(k for k in KINDS if k in _REGISTRY)})") from None


def registered_kinds() -> list[str]:
    return [k for k in KINDS if k in _REGISTRY]


def row_fields(kinds: Iterable[str]) -> list[pa.Field]:
    """The extra columns a job whose inputs have ``kinds`` carries: none for text only, else ``kind`` + each kind's.

    Fields come in ``KINDS`` order, so the schema does not depend on the order of the inputs.
    """
    wanted = set(kinds)
    if wanted <= {DEFAULT_KIND}:
        return []
    out: dict[str, pa.Field] = {KIND_COLUMN: pa.field(KIND_COLUMN, pa.string())}
    for name in KINDS:
        if name not in wanted:
            continue
        for field in kind_spec(name).fields:
            seen = out.get(field.name)
            if seen is not None and not seen.type.equals(field.type):
                raise SpecError(f"sample kinds disagree on column {field.name!r}: {seen.type} vs {field.type}")
            out[field.name] = field
    return list(out.values())


def kinds_of(table: pa.Table) -> pa.Array:
    """The kind of every row: the ``kind`` column with nulls as ``text``, or all ``text`` without one."""
    if KIND_COLUMN not in table.column_names:
        return pa.array([DEFAULT_KIND] * table.num_rows, pa.string())
    column = table.column(KIND_COLUMN)
    filled = pc.fill_null(column, DEFAULT_KIND)
    return filled.combine_chunks() if isinstance(filled, pa.ChunkedArray) else filled


