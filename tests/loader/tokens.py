"""Test fixture: small token releases in Megatron's indexed format whose every token id is unique.

Token ids run 1, 2, 3, ... over all documents (EOD included: the last id of each document), so the multiset of
real tokens a reader yields shows each repeated or skipped token, and a document's tokens are consecutive ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from datahub.shards.indexed import IndexedWriter


def write_tokens(root: Path, *, files: int = 4, documents: int = 30, max_len: int = 40, seed: int = 0,
                 first_id: int = 1, name: str = "tok") -> tuple[list[str], int]:
    """Write ``files`` indexed files of ``documents`` documents (1..max_len tokens); return (prefixes, token count)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    counter = first_id
    prefixes = []
    for f in range(files):
        prefix = str(root / f"{name}-{f:06d}")
        with IndexedWriter(prefix, dtype=np.int32) as writer:
            lengths = rng.integers(1, max_len + 1, size=documents)
            flat = np.arange(counter, counter + int(lengths.sum()), dtype=np.int32)
            writer.add_documents(flat, lengths, [f"{name}{f}-{d}" for d in range(documents)])
            counter += int(lengths.sum())
        prefixes.append(prefix)
    return prefixes, counter - first_id


def real_tokens(batch: dict[str, np.ndarray]) -> list[int]:
    tokens, mask = np.asarray(batch["tokens"]), np.asarray(batch["loss_mask"])
    return tokens[mask].tolist()
