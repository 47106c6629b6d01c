"""The ``text`` kind: one document; its identity is the hash of its identity-normalized text (datahub.sample_id)."""

from __future__ import annotations

import pyarrow as pa

from datahub.kinds.base import KindSpec, register_kind
from datahub.sample_id import sample_ids


def _text_sample_ids(table: pa.Table) -> pa.Array:
    return sample_ids(table.column("text"))


TEXT = register_kind(KindSpec(name="text", fields=(), sample_ids=_text_sample_ids,
                              description="one document; sample_id = xxh3-128 of the identity-normalized text"))
