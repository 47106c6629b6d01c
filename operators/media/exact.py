"""``image_exact_dedup``: drop rows whose image bytes equal an earlier kept sample's (any caption).

``exact_dedup``'s pipeline (lake ``exact_index``, keep rule, lineage ``dup_of``) with another key function: the
image's SHA-256 (``image_sha256``, filled by the readers) instead of the normalized text. The text
``normalization`` param has no effect here. Rows without an image get a per-row key (never duplicates).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from datahub.kinds.media import IMAGE_SHA256
from datahub.operator import register
from operators.dedup.exact_op import CONTENT_HASH, ExactDedup
from operators.dedup.ranking import row_ranks
from operators.dedup.steps import ROW_RANK


@dataclass(frozen=True)
class AddImageHash:
    keep_by: str | None

    def __call__(self, table: pa.Table) -> pa.Table:
        ranks = row_ranks(table, self.keep_by)
        digests = pc.cast(table.column(IMAGE_SHA256), pa.string())
        keys = pc.if_else(pc.is_null(digests), pc.binary_join_element_wise("empty:", ranks, ""),
                          pc.binary_join_element_wise("sha256:", digests, ""))
        return table.append_column(CONTENT_HASH, keys).append_column(ROW_RANK, ranks)


@register
class ImageExactDedup(ExactDedup):
    """Exact duplicates of the image bytes (SHA-256), whatever the caption."""

    name = "image_exact_dedup"
    version = "1"
    kinds = frozenset({"image_text"})

    @property
    def index_params_hash(self) -> str:
        payload = json.dumps({"op": self.name, "v": self.version, "key": "sha256"}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def content_hash_step(self) -> Callable[[pa.Table], pa.Table]:
        return AddImageHash(self.params.keep_by)
