"""Small eval sets written as JSONL for the registry, operator and release-gate tests."""

from __future__ import annotations

import json
from pathlib import Path

QUESTIONS = [
    ("q1", "In which year did the first crewed spacecraft land on the Moon, and what was the name of its lunar module?",
     "1969, the lunar module Eagle of Apollo 11"),
    ("q2", "Explain why ice floats on liquid water even though most solids sink in their own liquid phase.",
     "Hydrogen bonds hold ice in an open hexagonal lattice that is less dense than the liquid"),
    ("q3", "What is the time complexity of binary search on a sorted array of n elements in the worst case?",
     "O(log n), since every comparison halves the remaining interval"),
]


def write_evalset(path: Path, items=QUESTIONS, *, fields=("id", "question", "answer")) -> Path:
    with open(path, "w") as handle:
        for item in items:
            handle.write(json.dumps(dict(zip(fields, item))) + "\n")
    return path


def item_text(item_id: str) -> str:
    return next(f"{q}\n{a}" for i, q, a in QUESTIONS if i == item_id)
