"""The sample kinds a lake holds, by name only (no Arrow here, so job-spec models can name them cheaply)."""

from __future__ import annotations

from typing import Literal, get_args

Kind = Literal["text", "image_text", "chat", "preference", "trajectory"]
KINDS: tuple[str, ...] = get_args(Kind)
KIND_COLUMN = "kind"  # absent or null: "text" (text-only jobs do not write the column at all)
DEFAULT_KIND = "text"
