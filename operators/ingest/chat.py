"""Chat readers: OpenAI ``messages`` JSONL and ShareGPT ``conversations`` JSONL into ``chat`` samples.

One JSON object per line (plain, .gz, .zst), ``source_offset`` = 1-based line number, as the text JSONL reader.
Accepted layouts (the first present wins):

- OpenAI: ``{"messages": [{"role", "content", "name"?, "tool_calls"?, "tool_call_id"?}, ...], "tools"?: [...]}``;
  ``content`` may be a list of parts, whose ``text`` parts are joined by newlines. The legacy function-calling
  layout reads the same way: an assistant ``function_call`` is one tool call ``{"type": "function", "function":
  ...}``, a ``function`` message a ``tool`` message (its ``name`` kept), ``functions`` the tools.
- ShareGPT: ``{"conversations": [{"from": "human" | "gpt" | "system" | "function_call" | "observation" | "tool",
  "value": "..."}]}`` (``from`` mapped to user, assistant, system, assistant with tool_calls, tool, tool).

A record that does not fit is quarantined with the field and the reason (``messages[2].role: 'robot' is not one
of system, user, assistant, tool``); the other keys of a good record go to ``meta``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from datahub.kinds.posttraining import ROLES, canonical_json, render_messages
from operators.ingest.base import InputFile, Reader, _Buffer, register_reader
from operators.ingest.jsonl import json_objects

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                  "system": "system", "function_call": "assistant", "observation": "tool", "tool": "tool",
                  "function": "tool"}


# content part types holding text: Chat Completions' "text", the Responses API's "input_text" / "output_text"
TEXT_PART_TYPES = ("text", "input_text", "output_text")


class RecordError(ValueError):
    """A record that does not fit its kind: ``reason`` (a quarantine reason) and a detail naming the field."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class JsonRecordsReader(Reader):
    """JSON Lines into structured samples: subclasses turn one decoded object into ``(text, fields, meta)``."""

    format = "jsonl"
    suffixes = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson", ".jsonl.zstd")

    def parse(self, record: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:  # pragma: no cover
        """The samples (text, kind fields, meta) of one record; raises ``RecordError`` for a bad one."""
        raise NotImplementedError

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        for item in json_objects(self, file, buffer):
            if item is not None:
                line_no, record, line = item
                try:
                    samples = self.parse(record)
                except RecordError as exc:
                    buffer.quarantine(line_no, exc.reason, str(exc), line)
                else:
                    for body, fields, meta in samples:
                        buffer.sample(body, line_no, meta, fields=fields)
            yield None


def content_text(value: Any, where: str) -> str | None:
    """A message's content as text: a string, null, or a list of parts whose ``text`` parts are joined."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") in TEXT_PART_TYPES and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RecordError("unsupported_content", f"{where}[{i}]: a {kind!r} part; only text parts are read "
                                                         "(an image part belongs in an image_text input)")
        return "\n".join(texts)
    raise RecordError("invalid_field", f"{where}: a {type(value).__name__}, expected a string or a list of text parts")


def _optional_string(message: dict[str, Any], key: str, where: str) -> str | None:
    value = message.get(key)
    if value is None or isinstance(value, str):
        return value
    raise RecordError("invalid_field", f"{where}.{key}: a {type(value).__name__}, expected a string")


def openai_message(message: Any, where: str) -> dict[str, Any]:
    """One OpenAI-style message, validated, in the ``MESSAGE`` struct's shape."""
    if not isinstance(message, dict):
        raise RecordError("invalid_message", f"{where}: a {type(message).__name__}, expected an object with role and content")
    role = message.get("role")
    if role == "function":  # OpenAI's legacy function calling: the function's reply is a tool message
        role = "tool"
    if role not in ROLES:
        raise RecordError("invalid_message", f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise RecordError("invalid_field", f"{where}.tool_calls: a {type(tool_calls).__name__}, expected a list of calls")
    legacy_call = message.get("function_call")
    if not tool_calls and legacy_call is not None:  # legacy: one call, {name, arguments}
        if not isinstance(legacy_call, dict):
            raise RecordError("invalid_field", f"{where}.function_call: a {type(legacy_call).__name__}, expected an "
                                               "object with name and arguments")
        tool_calls = [{"type": "function", "function": legacy_call}]
    return {"role": role, "content": content_text(message.get("content"), f"{where}.content"),
            "name": _optional_string(message, "name", where),
            "tool_calls": canonical_json(tool_calls) if tool_calls else None,
            "tool_call_id": _optional_string(message, "tool_call_id", where)}


def sharegpt_message(turn: Any, where: str) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise RecordError("invalid_message", f"{where}: a {type(turn).__name__}, expected an object with from and value")
    source = turn.get("from")
    role = SHAREGPT_ROLES.get(source) if isinstance(source, str) else None
    if role is None:
        raise RecordError("invalid_message", f"{where}.from: {source!r} is not one of {', '.join(SHAREGPT_ROLES)}")
    value = turn.get("value")
    if value is not None and not isinstance(value, str):
        raise RecordError("invalid_field", f"{where}.value: a {type(value).__name__}, expected a string")
    if source == "function_call":  # the call as JSON text in `value`
        try:
            call = json.loads(value or "")
        except json.JSONDecodeError as exc:
            raise RecordError("invalid_tool_call", f"{where}.value: function_call is not JSON ({exc.msg})") from None
        return {"role": role, "content": None, "name": None, "tool_calls": canonical_json([call]), "tool_call_id": None}
    return {"role": role, "content": value, "name": None, "tool_calls": None, "tool_call_id": None}


def parse_messages(record: dict[str, Any], field: str = "messages") -> tuple[list[dict[str, Any]], str]:
    """The messages of a record (OpenAI ``field`` or ShareGPT ``conversations``) and the key they came from."""
    convert: Callable[[Any, str], dict[str, Any]]
    if field in record:
        key, convert = field, openai_message
    elif "conversations" in record:
        key, convert = "conversations", sharegpt_message
    else:
        raise RecordError("missing_field", f"no field {field!r} (OpenAI) or 'conversations' (ShareGPT); "
                                           f"the record has: {', '.join(map(repr, sorted(record))) or 'nothing'}")
    turns = record[key]
    if not isinstance(turns, list) or not turns:
        raise RecordError("invalid_field", f"{key}: expected a non-empty list of messages, got "
                                           f"{'an empty list' if turns == [] else type(turns).__name__}")
    return [convert(turn, f"{key}[{i}]") for i, turn in enumerate(turns)], key


@register_reader
class ChatJsonlReader(JsonRecordsReader):
    kinds = ("chat",)

    def parse(self, record: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        messages, key = parse_messages(record)
        tools_key = "tools" if record.get("tools") is not None or record.get("functions") is None else "functions"
        tools = record.get(tools_key)  # `functions`: the legacy layout's tool schemas
        if tools is not None and not isinstance(tools, list):
            raise RecordError("invalid_field", f"{tools_key}: a {type(tools).__name__}, expected a list of tool schemas")
        meta = {k: v for k, v in record.items() if k not in (key, tools_key)}
        fields = {"messages": messages, "tools": canonical_json(tools) if tools else None}
        return [(render_messages(messages), fields, meta)]
