"""Benchmark text: real English man pages from /usr/share/man (no downloads), else a Zipf model.

``planted_corpus`` adds near-duplicates of some documents at known word-edit rates, and
``exact_jaccard_clusters`` gives the ground truth: connected components of the graph of
document pairs whose exact word-5-gram Jaccard is >= the threshold.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

import numpy as np

MAN_ROOT = Path("/usr/share/man")
_ESCAPE = re.compile(r"\\f[BIRP1-4]|\\f\(..|\\f\[[^\]]*\]|\\\(..|\\\[[^\]]*\]|\\[-&|^/,e0 ]|\\\*.")
_MACRO = re.compile(r"^[.'](\\\"|[A-Za-z]{1,3})\s*")


def _troff_to_text(source: str) -> str:
    lines = []
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        line = _MACRO.sub("", line)
        line = _ESCAPE.sub(" ", line).replace("\\", "")
        if line.strip():
            lines.append(line)
    return "\n".join(lines)


def man_page_texts(limit: int, *, min_chars: int = 400) -> list[str]:
    """Up to ``limit`` English man pages as plain text, in a fixed (sorted) order."""
    texts: list[str] = []
    for section in sorted(MAN_ROOT.glob("man[1-8]")):
        for path in sorted(section.glob("*.gz")):
            try:
                text = _troff_to_text(gzip.decompress(path.read_bytes()).decode("utf-8", "replace"))
            except (OSError, EOFError):
                continue
            if len(text) >= min_chars:
                texts.append(text)
                if len(texts) >= limit:
                    return texts
    return texts


def zipf_texts(count: int, *, seed: int = 0, mean_words: int = 900, vocabulary: int = 50_000) -> list[str]:
    """Synthetic documents: words drawn from a Zipf(1.1) vocabulary of pronounceable strings."""
    rng = np.random.default_rng(seed)
    syllables = np.array([c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"])
    lengths = rng.integers(1, 4, vocabulary)
    words = np.array(["".join(rng.choice(syllables, n)) for n in lengths])
    texts = []
    for _ in range(count):
        n = max(20, int(rng.normal(mean_words, mean_words / 3)))
        ids = np.minimum(rng.zipf(1.1, n) - 1, vocabulary - 1)
        texts.append(" ".join(words[ids]))
    return texts


def base_texts(count: int, *, seed: int = 0) -> list[str]:
    """Man pages if the machine has them, topped up with Zipf text."""
    texts = man_page_texts(count) if MAN_ROOT.exists() else []
    if len(texts) < count:
        texts += zipf_texts(count - len(texts), seed=seed)
    return texts


def edit_words(text: str, rate: float, rng: random.Random) -> str:
    """Substitute, delete or insert a word at each position with probability ``rate``."""
    words = text.split()
    out: list[str] = []
    for word in words:
        if rng.random() < rate:
            op = rng.randrange(3)
            if op == 0:
                out.append(rng.choice(words))
            elif op == 2:
                out.extend([word, rng.choice(words)])
        else:
            out.append(word)
    return " ".join(out)


def planted_corpus(
    count: int,
    *,
    duplicate_fraction: float = 0.3,
    edit_rates: tuple[float, ...] = (0.0, 0.002, 0.005, 0.01, 0.2),
    seed: int = 0,
) -> tuple[list[str], list[int]]:
    """``count`` texts; a fraction are edited copies of earlier originals.

    Returns the texts and, per text, the index of the original it was copied from (itself
    for originals). Edit rate 0.2 makes far variants (Jaccard ~ 0.1) that must not merge.
    """
    rng = random.Random(seed)
    n_dup = int(count * duplicate_fraction)
    originals = base_texts(count - n_dup, seed=seed)
    texts = list(originals)
    source = list(range(len(originals)))
    for _ in range(n_dup):
        i = rng.randrange(len(originals))
        texts.append(edit_words(originals[i], rng.choice(edit_rates), rng))
        source.append(i)
    order = list(range(len(texts)))
    rng.shuffle(order)
    return [texts[i] for i in order], [order.index(source[i]) for i in order]


def write_jsonl(path: Path, texts: list[str]) -> None:
    with path.open("w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"doc{i:07d}", "text": text}) + "\n")


def exact_jaccard_pairs(hashes: np.ndarray, offsets: np.ndarray, threshold: float) -> np.ndarray:
    """All document pairs ``(i, j), i < j`` with exact shingle-set Jaccard >= threshold (scipy.sparse)."""
    import scipy.sparse as sp

    n_docs = len(offsets) - 1
    docs = np.repeat(np.arange(n_docs), np.diff(offsets))
    keys = np.unique(np.stack([docs, hashes.view(np.int64)], axis=1), axis=0)
    _, columns = np.unique(keys[:, 1], return_inverse=True)
    matrix = sp.csr_matrix((np.ones(len(keys), np.int32), (keys[:, 0], columns)), shape=(n_docs, columns.max() + 1))
    sizes = np.asarray(matrix.sum(axis=1)).ravel()
    inter = sp.triu(matrix @ matrix.T, k=1).tocoo()
    union = sizes[inter.row] + sizes[inter.col] - inter.data
    keep = inter.data >= threshold * union
    return np.stack([inter.row[keep], inter.col[keep]], axis=1)


def components(n_docs: int, pairs: np.ndarray) -> np.ndarray:
    """Component label (smallest member index) per document, for the given undirected pairs."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    graph = sp.coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n_docs, n_docs))
    _, labels = connected_components(graph, directed=False)
    smallest = np.full(labels.max() + 1, n_docs)
    np.minimum.at(smallest, labels, np.arange(n_docs))
    return smallest[labels]


def pair_scores(truth_labels: np.ndarray, predicted_labels: np.ndarray) -> tuple[float, float, float]:
    """Pairwise precision, recall and F1 of a clustering against the ground-truth clustering."""

    def same_cluster_pairs(labels: np.ndarray) -> set[tuple[int, int]]:
        order = np.argsort(labels, kind="stable")
        pairs: set[tuple[int, int]] = set()
        groups = np.split(order, np.flatnonzero(np.diff(labels[order])) + 1)
        for group in groups:
            if len(group) > 1:
                g = sorted(group.tolist())
                pairs.update((a, b) for k, a in enumerate(g) for b in g[k + 1 :])
        return pairs

    truth = same_cluster_pairs(truth_labels)
    predicted = same_cluster_pairs(predicted_labels)
    tp = len(truth & predicted)
    precision = tp / len(predicted) if predicted else 1.0
    recall = tp / len(truth) if truth else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1
