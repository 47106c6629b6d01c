"""``prompt_dedup``: exact dedup on the prompt only, so one prompt with many answers keeps one sample.

The key is the prompt's rendering (``datahub.kinds.posttraining``): for a ``chat``, its messages before the first
assistant message; for a ``preference``, its ``prompt``; one ``<|ROLE|>`` block per message. A pair's kind is hashed
in after normalization, so a chat and a preference pair on the same prompt are never each other's duplicates, and a
chat's key is the one version 1 wrote. A prompt that normalizes to nothing (a reward-model pair without one) gets a
per-sample key, so such pairs are never each other's duplicates. It runs the ``exact_dedup`` machinery (normalization,
keep rule, incremental lake index, lineage), with the prompt standing in for ``text`` while it runs and its own
key step (``PromptContentHash``); dropped rows get reason ``duplicate_prompt`` and the usual ``dup_of`` ref. A dedup
signature is a key function, not a new pipeline (DESIGN.md).

Upgrading from version 1: its index rows are a namespace of their own (``exact_index``'s ``params_hash``), so an
incremental run also looks them up. A new chat is matched against every prompt version 1 indexed; version 1 keyed a
preference pair's prompt without its kind, so a chat may still be dropped as the duplicate of a pair indexed by
version 1, and a new pair is not matched against version 1's pairs (``datahub run JOB --full`` over all inputs once
indexes them anew).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.kinds import kinds_of
from datahub.operator import DROP_OP, DROP_REASON, OperatorContext, register
from operators.dedup.exact import hex_digests, value_hashes
from operators.dedup.exact_op import CONTENT_HASH, ExactDedup
from operators.dedup.index import EXACT_INDEX, read_index
from operators.dedup.normalize import Normalization, normalize_texts
from operators.dedup.params import ExactDedupParams
from operators.dedup.ranking import lake_ranks, row_ranks
from operators.dedup.steps import ROW_RANK, Select
from operators.posttraining.messages import as_bool, flatten, strings

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

FULL_TEXT = "_prompt_dedup_text"
PAIR_KEY_PREFIX = "preference\x00"  # hashed before a pair's normalized prompt (a chat's starts with a role)
REASON = "duplicate_prompt"


def prompt_blocks(column: pa.Array | pa.ChunkedArray, *, until_assistant: bool) -> pa.Array:
    """Per row, the ``<|ROLE|>`` blocks of its messages joined by newlines (up to the first assistant one)."""
    flat = flatten(column)
    roles = strings(flat.field("role"))
    blocks = pc.binary_join_element_wise("<|", roles, "|>\n", strings(flat.field("content")), "")
    keep = np.ones(len(flat.parent), dtype=bool)
    if until_assistant:
        assistant = as_bool(pc.equal(roles, "assistant")).astype(np.int64)
        seen = np.cumsum(assistant)  # assistants up to and including each message, over the whole batch
        before_row = np.concatenate([[0], np.cumsum(assistant)])[flat.offsets[:-1]]
        keep = (seen - before_row[flat.parent]) == 0
    kept_parent = flat.parent[keep]
    counts = np.bincount(kept_parent, minlength=flat.rows)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), blocks.filter(pa.array(keep)))
    return pc.binary_join(lists, "\n")


@dataclass(frozen=True)
class PromptAsText:
    """Batch function: keep the full ``text`` aside and put the prompt's rendering in its place."""

    def __call__(self, table: pa.Table) -> pa.Table:
        if not table.num_rows or "text" not in table.column_names:
            return table
        kinds = kinds_of(table)
        prompt = pa.nulls(table.num_rows, pa.string())
        if "messages" in table.column_names:
            prompt = pc.if_else(pc.equal(kinds, "chat"), prompt_blocks(table.column("messages"), until_assistant=True), prompt)
        if "prompt" in table.column_names:
            prompt = pc.if_else(pc.equal(kinds, "preference"), prompt_blocks(table.column("prompt"), until_assistant=False), prompt)
        text = table.column("text")
        table = table.append_column(FULL_TEXT, text)
        return table.set_column(table.column_names.index("text"), "text", prompt)


@dataclass(frozen=True)
class RestoreText:
    """Batch function: the full ``text`` back; this operator's drops renamed ``duplicate_prompt``."""

    op_id: str

    def __call__(self, table: pa.Table) -> pa.Table:
        if FULL_TEXT not in table.column_names:
            return table
        table = table.set_column(table.column_names.index("text"), "text", table.column(FULL_TEXT)).drop_columns([FULL_TEXT])
        if DROP_REASON in table.column_names and DROP_OP in table.column_names:
            mine = pc.fill_null(pc.equal(table.column(DROP_OP), self.op_id), False)
            reason = pc.if_else(mine, pa.scalar(REASON), table.column(DROP_REASON))
            table = table.set_column(table.column_names.index(DROP_REASON), DROP_REASON, reason)
        return table


@dataclass(frozen=True)
class PromptContentHash:
    """``exact_dedup``'s key step with a pair's kind hashed in after normalization (``PAIR_KEY_PREFIX``).

    An SFT chat and a DPO pair on one prompt are different data (their sample_ids differ too); a chat's key stays
    version 1's, so the prompts it indexed are still matched. A prompt that normalizes to nothing (a reward-model pair
    without one) keeps its per-sample ``empty:`` key, so bare pairs are not each other's duplicates.
    """

    normalization: Normalization
    keep_by: str | None

    def __call__(self, table: pa.Table) -> pa.Table:
        ranks = row_ranks(table, self.keep_by)
        normalized = pc.fill_null(normalize_texts(table.column("text"), self.normalization), "")
        empty = pc.equal(pc.utf8_length(normalized), 0)
        pair = pc.and_(pc.equal(kinds_of(table), "preference"), pc.invert(empty))
        keyed = pc.if_else(pair, pc.binary_join_element_wise(PAIR_KEY_PREFIX, normalized, ""), normalized)
        hashes = hex_digests(value_hashes(keyed))
        hashes = pc.if_else(empty, pc.binary_join_element_wise("empty:", ranks, ""), hashes)
        return table.append_column(CONTENT_HASH, hashes).append_column(ROW_RANK, ranks)


class _LakeRows:
    """Index rows as candidates: content hash and the lake rank of the sample (as ``exact_dedup``'s)."""

    def __call__(self, table: pa.Table) -> pa.Table:
        return pa.table({CONTENT_HASH: pc.cast(table.column("content_hash"), pa.string()),
                         ROW_RANK: pc.cast(lake_ranks(table.column("sample_id")), pa.string())})


@register
class PromptDedup(ExactDedup):
    """Exact duplicates of the prompt (chat: messages before the first assistant turn; preference: ``prompt``)."""

    name = "prompt_dedup"
    version = "2"  # 2: a pair's kind leads its key (index rows in a new namespace; version 1's are looked up too)
    Params = ExactDedupParams
    kinds: ClassVar[frozenset[str]] = frozenset({"chat", "preference"})

    def content_hash_step(self) -> Callable[[pa.Table], pa.Table]:
        """The key step: a pair's kind hashed in after normalization (``PromptContentHash``)."""
        return PromptContentHash(self.params.normalization.build(), self.params.keep_by)

    def apply(self, frame: Frame, context: OperatorContext) -> Frame:
        swapped = frame.map_batches(PromptAsText(), name="prompt_dedup.prompt")
        return super().apply(swapped, context).map_batches(RestoreText(self.op_id), name="prompt_dedup.restore")

    @property
    def version_1_params_hash(self) -> str:
        """The namespace of the index rows version 1 wrote (same normalization): ``index_params_hash`` at version 1."""
        return _PromptDedupVersion1(self.params).index_params_hash

    def _shared_with_lake(self, hashes: Frame, context: OperatorContext) -> tuple[Frame, Frame | None, Frame | None]:
        """As ``exact_dedup``'s, with the index rows of version 1 that a new key holds counted as the lake's too."""
        shared, lake_rows, known = super()._shared_with_lake(hashes, context)
        new_keys = hashes.groupby_agg([CONTENT_HASH], {"rows": (CONTENT_HASH, "count")}).map_batches(
            Select((CONTENT_HASH,), ((CONTENT_HASH, "content_hash"),)), name="prompt_dedup.v1_keys")
        index = read_index(context, EXACT_INDEX, columns=["content_hash", "sample_id"],
                           params_hash=self.version_1_params_hash, among=("content_hash", new_keys))
        if index is None:
            return shared, lake_rows, known
        v1_rows = index[0].map_batches(_LakeRows(), name="prompt_dedup.v1_rows").materialize()
        if v1_rows.count() == 0:
            return shared, lake_rows, known
        in_v1 = v1_rows.map_batches(Select((CONTENT_HASH,)), name="prompt_dedup.v1_lake_keys")
        shared = shared.union(in_v1).groupby_agg([CONTENT_HASH], {"n": (CONTENT_HASH, "count")},
                                                 having=Select((CONTENT_HASH,))).materialize()
        return shared, (v1_rows if lake_rows is None else lake_rows.union(v1_rows)), known


class _PromptDedupVersion1(PromptDedup):
    """Names version 1's index namespace only (not registered; never run)."""

    version = "1"
