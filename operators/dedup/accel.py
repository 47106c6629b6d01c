"""Compiled MinHash for word shingles: one pass per document from UTF-8 bytes to its signature (numba).

The same hash as the numpy path (``operators.dedup.shingles`` and ``operators.dedup.minhash``, whose
docstrings define it), computed per document in one loop nest (``_minhash_numba.py``): token bytes into the
polynomial hash, token ``fmix64``, the window of the last ``n`` token hashes combined with the position
constants, ``fmix64``, the scheme's premix, then per permutation a multiply-add and minimum over the
document's shingles (32-bit lanes for ``affine32``, which LLVM vectorizes). The numpy path stays as the
reference (tests compare both bit for bit) and the fallback: it runs when numba cannot be imported, when
``DATAHUB_MINHASH_NUMBA=0``, and for character shingles. Compiled code is cached on disk
(``cache=True``: next to the module, or numba's user cache dir), so a process compiles once per machine
(about 2 s) and later loads it (about 0.4 s).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

import numpy as np

log = logging.getLogger("datahub.dedup")
_kernels: tuple[Any, Any] | None = None
_failed = False


def enabled() -> bool:
    """Whether signatures take the compiled path (numba installed, not turned off by the environment)."""
    if _failed or os.environ.get("DATAHUB_MINHASH_NUMBA", "1") == "0":
        return False
    return _kernels is not None or importlib.util.find_spec("numba") is not None


def word_signatures(data: np.ndarray, offsets: np.ndarray, position_constants: np.ndarray, a: np.ndarray,
                    b: np.ndarray, width: int) -> np.ndarray | None:
    """``(n_docs, num_perm)`` signatures of word n-gram shingles (``n = len(position_constants)``), or None
    when numba turns out not to load (the caller then takes the numpy path)."""
    kernels = _load()
    if kernels is None:
        return None
    n_docs = len(offsets) - 1
    out = np.empty((n_docs, len(a)), dtype=np.uint32 if width == 32 else np.uint64)
    if n_docs:
        kernels[0 if width == 32 else 1](
            np.ascontiguousarray(data, dtype=np.uint8), np.ascontiguousarray(offsets, dtype=np.int64),
            np.ascontiguousarray(position_constants, dtype=np.uint64), a, b, out)  # a, b: the scheme's dtype
    return out


def _load() -> tuple[Any, Any] | None:
    global _kernels, _failed
    if _kernels is None and not _failed:
        try:
            from operators.dedup import _minhash_numba
        except Exception as error:  # a broken numba/llvmlite install: same signatures from numpy, slower
            _failed = True
            log.warning("numba could not be loaded (%s); MinHash signatures use the numpy path", error)
            return None
        _kernels = (_minhash_numba._kernel32, _minhash_numba._kernel64)
    return _kernels
