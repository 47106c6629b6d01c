"""``datahub evalset add/list``: benchmark items as versioned rows of the lake's ``evalsets`` table.

Input: JSONL (optionally ``.gz``) or Parquet, one item per record. The prompt is the first of the fields
``PROMPT_FIELDS`` present, else the fields of the first of the common benchmark layouts ``PROMPT_LAYOUTS`` present
(SST-2's ``sentence``, WinoGrande's ``sentence, option1, option2``, MNLI's ``premise, hypothesis``, HellaSwag's
``ctx, endings``, PIQA's ``goal, sol1, sol2``), else a conversation's user turns, or the fields named by
``prompt_fields`` (``evalset add --prompt-field``); the answer is the first of ``ANSWER_FIELDS`` (a list or number
answer is kept as JSON); the item id is the ``id`` field (else ``item_id``, else the 0-based record number). A record
with no usable prompt or answer text is an error naming the file and line: an eval set is curated, so nothing is
silently skipped. So is an item of fewer than ``MIN_ITEM_WORDS`` words (its label alone, e.g. "1", or a very short
question and answer; in a script written without spaces, Chinese, Japanese or Thai, letters and digits are counted
instead, since the matcher sees such a sentence as one word): such a text matches
every sample or chat turn that is just those words; every such item of a file is named at once. An answer-only item
(a reference completion) of more words is kept: it matches by its n-grams. Adding a name again with other content
makes version N+1; the same content is a no-op.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import LakeError, SpecError
from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches
from datahub.lake.timestamps import iso_utc
from datahub.retry import retry_policy, storage_errors
from datahub.lake.lineage_rows import lineage_rows
from datahub.sample_id import sample_ids
from operators.decontam.evalsets import EVALSETS, EVALSETS_TABLE, ROW_GROUP_ROWS
from operators.decontam.ngrams import NgramHasher
from operators.decontam.views import ANSWER_ROLES, SKIPPED_ROLES, unspaced_long_enough
from operators.ingest.chat import TEXT_PART_TYPES

PROMPT_FIELDS = ("prompt", "question", "input", "query", "problem", "instruction")
# Benchmarks whose question is in none of PROMPT_FIELDS: (first field, then the others present), the prompt their texts
# one per line (a list field's strings one per line). Tried in this order when no PROMPT_FIELDS field is present.
PROMPT_LAYOUTS = (
    ("premise", "hypothesis"),  # MNLI, RTE, SNLI, ANLI
    ("sentence", "option1", "option2"),  # WinoGrande (SST-2 and CoLA: sentence alone)
    ("ctx", "endings"),  # HellaSwag
    ("goal", "sol1", "sol2"),  # PIQA
)
# An item of fewer words (question and answer together, counted by the matcher's own tokenizer, NgramHasher) is
# refused (a label, "Tell me."): below 13 words an item matches a text only by equality, and so short a text is what
# clean samples say ("1", "Positive.", "OK", "Thank you."). It counts the question with the answer because the matcher
# sees them together (a chat's question+answer view), so "Capital of France?" + "Paris" (4) is kept and caught inside a
# chat, and "Largest planet?" + "Jupiter" (3) is refused: a 3-word pair is what clean chats say ("Really?" / "Yes,
# really."). The matcher's floor for conversation views must not be higher
# (operators.decontam.views.MIN_VIEW_WORDS <= MIN_ITEM_WORDS), or a registrable item inside a chat is not matched.
MIN_ITEM_WORDS = 4
SHORT_ITEMS_SHOWN = 10  # items named by the error refusing a file's short items (then how many more)
ANSWER_FIELDS = ("answer", "output", "target", "label", "solution", "canonical_solution", "completion", "response")
ID_FIELDS = ("id", "item_id", "task_id", "question_id")  # HumanEval's task_id, MT-Bench's question_id
# chat benchmarks: OpenAI messages, ShareGPT conversations, MT-Bench turns (a list of user turns)
CONVERSATION_FIELDS = ("messages", "conversations", "turns")
# left out of an item (SKIPPED_ROLES): boilerplate shared across items and corpora (a default system prompt would mark
# every sample carrying it as contaminated), or a tool's output rather than the benchmark's question. The decontam
# views (operators/decontam/views.py) build a chat sample's texts with the same roles.
EVALSET_OP = "evalset.add@1"
LIST_BATCH_ROWS = 65_536  # rows of the table grouped at a time by ``list_evalsets``
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


@dataclass(frozen=True)
class EvalSet:
    """One registered version of an eval set."""

    name: str
    version: int
    items: int
    source_uri: str
    digest: str
    added: datetime
    versions: int = 1
    created: bool = True  # False: ``add`` found the same content already registered (no new version)

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["added"] = iso_utc(self.added)  # every --json date-time: ISO 8601 UTC with Z
        return out


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value if value.strip() else None
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _joined(record: dict[str, Any], fields: tuple[str, ...]) -> str | None:
    """The texts of ``fields`` present in ``record``, one per line (a list of strings one item per line)."""
    parts: list[str] = []
    for name in fields:
        value = record.get(name)
        values = value if isinstance(value, list) and all(isinstance(v, str) for v in value) else [value]
        parts.extend(t for t in (_text(v) for v in values) if t)
    return "\n".join(parts) or None


def _layout_prompt(record: dict[str, Any]) -> str | None:
    for layout in PROMPT_LAYOUTS:
        if _text(record.get(layout[0])) is not None:
            return _joined(record, layout)
    return None


def _pick(record: dict[str, Any], fields: tuple[str, ...]) -> Any:
    for name in fields:
        if name in record and record[name] is not None:
            return record[name]
    return None


def _part_text(part: Any) -> str:
    """A content part's text as ``operators.ingest.chat.content_text`` reads it (a string, or a text part whose type is
    one of ``TEXT_PART_TYPES`` or absent); "" for other parts (an image's), which an item leaves out, not refuses."""
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type", "text") in TEXT_PART_TYPES and isinstance(part.get("text"), str):
        return str(part["text"])
    return ""


def _content(message: Any) -> tuple[str | None, str | None]:
    """(role, text) of one message: OpenAI {role, content (a string or text parts)}, ShareGPT {from, value}, or a
    plain string (an MT-Bench user turn)."""
    if isinstance(message, str):
        return "user", message
    if not isinstance(message, dict):
        return None, _text(message)
    role = message.get("role", message.get("from"))
    content = message.get("content", message.get("value"))
    if isinstance(content, list):  # OpenAI content parts: the text ones (Chat Completions' and the Responses API's)
        content = "\n".join(t for t in map(_part_text, content) if t)
    return (str(role).lower() if role is not None else None), _text(content)


def _conversation(record: dict[str, Any]) -> tuple[str | None, str | None]:
    """(prompt, answer) of a chat item: the user turns, then the assistant turns, one per line (system, developer and
    tool turns left out: SKIPPED_ROLES)."""
    turns = _pick(record, CONVERSATION_FIELDS)
    if not isinstance(turns, list):
        return None, None
    prompt: list[str] = []
    answer: list[str] = []
    for message in turns:
        role, text = _content(message)
        if text and role not in SKIPPED_ROLES:
            (answer if role in ANSWER_ROLES else prompt).append(text)
    return ("\n".join(prompt) or None), ("\n".join(answer) or None)


def _records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(enumerate(pq.read_table(path).to_pylist(), start=1))
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecError(f"{path}:{line_number}: not a JSON object ({exc.msg}); one item per line, e.g. "
                                '{"id": "q1", "prompt": "...", "answer": "..."}') from None
            if not isinstance(record, dict):
                raise SpecError(f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}")
            out.append((line_number, record))
    return out


def read_items(path: str | Path, *, prompt_fields: tuple[str, ...] | list[str] | None = None) -> pa.Table:
    """The items of an eval-set file as ``(item_id, prompt, answer, text)``; errors name file and line.
    ``prompt_fields``: the fields whose texts (one per line) are each item's prompt, instead of the known names."""
    path = Path(path)
    fields = tuple(prompt_fields or ())
    if path.is_dir():
        raise SpecError(f"{path}: a directory; give the eval-set file in it (JSONL, JSONL.gz or Parquet with "
                        "prompt/answer fields), one set per file")
    if not path.is_file():
        raise SpecError(f"{path}: no such eval-set file (JSONL, JSONL.gz or Parquet with prompt/answer fields)")
    ids, prompts, answers, lines, found = [], [], [], [], []
    for number, (line, record) in enumerate(_records(path)):
        answer = _text(_pick(record, ANSWER_FIELDS))
        if fields:
            prompt = _joined(record, fields)
            if prompt is None:
                raise SpecError(f"{path}:{line}: none of the prompt fields {', '.join(fields)} (--prompt-field) has "
                                f"text (got {', '.join(sorted(record)) or 'none'})")
        else:
            prompt = _text(_pick(record, PROMPT_FIELDS))
            if prompt is None:
                prompt = _layout_prompt(record)
            if prompt is None and answer is None:
                prompt, answer = _conversation(record)
        if prompt is None and answer is None:
            raise SpecError(f"{path}:{line}: no prompt or answer text; expected one of the fields "
                            f"{', '.join(PROMPT_FIELDS)} and/or {', '.join(ANSWER_FIELDS)}, or a conversation in "
                            f"{', '.join(CONVERSATION_FIELDS)} (got {', '.join(sorted(record)) or 'none'}), or "
                            "name the fields holding the question with `datahub evalset add ... --prompt-field FIELD`")
        item_id = _pick(record, ID_FIELDS)
        ids.append(str(item_id) if item_id is not None else str(number))
        prompts.append(prompt)
        answers.append(answer)
        lines.append(line)
        found.append(", ".join(sorted(record)) or "none")
    if not ids:
        raise SpecError(f"{path}: no items; an eval set needs at least one record")
    seen: set[str] = set()
    for item_id in ids:
        if item_id in seen:
            raise SpecError(f"{path}: item id {item_id!r} appears twice; ids must be unique within a set")
        seen.add(item_id)
    texts = [("\n".join(t for t in (p, a) if t)) for p, a in zip(prompts, answers)]
    _refuse_short_items(path, ids, prompts, texts, lines, found)
    return pa.table({"item_id": pa.array(ids, pa.string()), "prompt": pa.array(prompts, pa.string()),
                     "answer": pa.array(answers, pa.string()), "text": pa.array(texts, pa.string())})


def _refuse_short_items(path: Path, ids: list[str], prompts: list[str | None], texts: list[str], lines: list[int],
                        found: list[str]) -> None:
    """A SpecError naming every item (the first ``SHORT_ITEMS_SHOWN``, and how many) of fewer than MIN_ITEM_WORDS
    words, counted as the matcher counts them: it would match any clean sample or chat turn of just those words ("1",
    "Positive."). An item in a script written without spaces is counted in letters and digits (``UNSPACED_SCRIPTS``)."""
    array = pa.array(texts, pa.string())
    words = NgramHasher().hashes_and_words(array)[2]
    spared = unspaced_long_enough(array, MIN_ITEM_WORDS)  # Chinese, Japanese, Thai: letters and digits, not words
    short = [i for i in range(len(texts)) if words[i] < MIN_ITEM_WORDS and not spared[i]]
    if not short:
        return
    named = []
    for i in short[:SHORT_ITEMS_SHOWN]:
        what = (f"has no prompt, so its text is its answer alone, {words[i]} word(s)" if prompts[i] is None
                else f"is {words[i]} word(s)")
        named.append(f"{path}:{lines[i]}: item {ids[i]!r} {what} ({texts[i][:60]!r}, fields found: {found[i]})")
    more = f"\n... and {len(short) - SHORT_ITEMS_SHOWN} more" if len(short) > SHORT_ITEMS_SHOWN else ""
    raise SpecError(
        f"{path}: {len(short)} item{'s' if len(short) > 1 else ''} under {MIN_ITEM_WORDS} words:\n" + "\n".join(named)
        + more + f"\nAn item needs at least {MIN_ITEM_WORDS} words, its question and answer together (a word: a run "
        "of letters and digits between spaces and punctuation; in Chinese, Japanese or Thai, a letter or digit), or "
        "it matches any sample or chat turn saying just that. Give each its full question: put it in a prompt field "
        f"({', '.join(PROMPT_FIELDS)}), use a known layout ({'; '.join(', '.join(x) for x in PROMPT_LAYOUTS)}), or "
        "name the fields that hold it with `datahub evalset add ... --prompt-field FIELD` (repeatable); or leave "
        "these items out")


def _digest(items: pa.Table) -> str:
    digest = hashlib.sha256()
    for item_id, text in sorted(zip(items.column("item_id").to_pylist(), items.column("text").to_pylist())):
        digest.update(item_id.encode() + b"\x00" + text.encode() + b"\x01")
    return digest.hexdigest()


def _check_name(name: str) -> None:
    if not name or not set(name) <= _NAME_CHARS or "@" in name or ":" in name or not name[0].isalnum():
        raise SpecError(f"eval set name {name!r}: use letters, digits, '_', '.' or '-', starting with a letter or "
                        "digit (it appears in lineage refs as NAME@VERSION:ITEM)")


def add_evalset(lake: Lake, name: str, path: str | Path, *,
                prompt_fields: tuple[str, ...] | list[str] | None = None) -> EvalSet:
    """Register the items of ``path`` as the next version of eval set ``name`` (a no-op for unchanged content);
    ``prompt_fields``: as ``read_items``."""
    _check_name(name)
    return _register(lake, name, read_items(path, prompt_fields=prompt_fields), path)


def _register(lake: Lake, name: str, items: pa.Table, path: str | Path) -> EvalSet:
    """Commit ``items`` (``read_items``' columns) as the next version of ``name`` unless its content is the latest."""
    digest = _digest(items)
    existing = [s for s in list_evalsets(lake, all_versions=True) if s.name == name]
    if existing and existing[-1].digest == digest:
        latest = existing[-1]
        return EvalSet(latest.name, latest.version, latest.items, latest.source_uri, latest.digest, latest.added,
                       versions=len(existing), created=False)
    version = existing[-1].version + 1 if existing else 1
    now = datetime.now(timezone.utc)
    n = items.num_rows
    source_uri = str(Path(path).resolve())
    hashes = sample_ids(items.column("text"))
    rows = pa.table({
        "evalset": pa.array([name] * n, pa.string()),
        "version": pa.array([version] * n, pa.int64()),
        "item_id": items.column("item_id"),
        "prompt": items.column("prompt"),
        "answer": items.column("answer"),
        "text": items.column("text"),
        "item_hash": hashes,
        "source_uri": pa.array([source_uri] * n, pa.string()),
        "digest": pa.array([digest] * n, pa.string()),
        "added": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
    }, schema=EVALSETS)
    txn = f"evalset/{name}@{version}"
    refs = pc.binary_join_element_wise(f"{name}@{version}:", items.column("item_id"), "")
    lake.commit("lineage", lineage_rows(hashes, run_id=txn, op=EVALSET_OP, action="ingested", reason="evalset",
                                        ref=refs, ts=now), txn=txn, metadata={"datahub.evalset": f"{name}@{version}"})
    if lake.commit(EVALSETS_TABLE, rows, txn=txn, metadata={"datahub.evalset": f"{name}@{version}"},
                   row_group_rows=ROW_GROUP_ROWS) is None:
        raise LakeError(f"eval set {name} version {version} was added concurrently by another writer; "
                        f"list them with: datahub evalset list --lake {lake.ref}")
    return EvalSet(name, version, n, source_uri, digest, now, versions=version)


def list_evalsets(lake: Lake, *, all_versions: bool = False) -> list[EvalSet]:
    """Registered eval sets: the latest version of each (or every version), by name then version."""
    if not lake.exists(EVALSETS_TABLE):
        return []
    # a batch at a time (every gate of create, merge and redact lists them, some twice): one row per set version is
    # held, not the table's per-item source_uri and digest strings
    def attempt() -> list[pa.Table]:  # a broken read starts again (Lake.read's retries)
        with storage_errors(f"read {lake.table_uri(EVALSETS_TABLE)}"):
            columns = ["evalset", "version", "source_uri", "digest", "added"]
            return [pa.Table.from_batches([batch]).group_by(["evalset", "version"], use_threads=False).aggregate([
                ("source_uri", "first"), ("digest", "first"), ("added", "min"), ("evalset", "count")])
                for batch in scan_batches(lake.dataset(EVALSETS_TABLE), columns=columns, batch_rows=LIST_BATCH_ROWS)]

    partial = retry_policy(attempt, lake.retry)
    if not partial:
        return []
    grouped = pa.concat_tables(partial).group_by(["evalset", "version"], use_threads=False).aggregate([
        ("source_uri_first", "first"), ("digest_first", "first"), ("added_min", "min"), ("evalset_count", "sum")])
    grouped = grouped.rename_columns({"source_uri_first_first": "source_uri_first",
                                      "digest_first_first": "digest_first",
                                      "added_min_min": "added_min", "evalset_count_sum": "evalset_count"})
    grouped = grouped.sort_by([("evalset", "ascending"), ("version", "ascending")])
    out: list[EvalSet] = []
    counts: dict[str, int] = {}
    for row in grouped.to_pylist():
        counts[row["evalset"]] = counts.get(row["evalset"], 0) + 1
        out.append(EvalSet(row["evalset"], int(row["version"]), int(row["evalset_count"]), row["source_uri_first"],
                           row["digest_first"], row["added_min"]))
    out = [EvalSet(s.name, s.version, s.items, s.source_uri, s.digest, s.added, versions=counts[s.name]) for s in out]
    if all_versions:
        return out
    latest: dict[str, EvalSet] = {}
    for s in out:
        latest[s.name] = s
    return list(latest.values())


__all__ = ["EvalSet", "add_evalset", "list_evalsets", "read_items"]
