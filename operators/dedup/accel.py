"""Compiled MinHash for word shingles: one pass per document from UTF-8 bytes to its signature (C).

The same hash as the numpy path (``operators.dedup.shingles`` and ``operators.dedup.minhash``, whose
docstrings define it), computed per document in one loop nest (``_minhash_c.c``, a C extension built when
the package is installed): token bytes into the polynomial hash, token ``fmix64``, the window of the last
``n`` token hashes combined with the position constants, ``fmix64``, the scheme's premix, then per
permutation a multiply-add and minimum over the document's shingles (32-bit lanes for ``affine32``, built
for AVX-512, AVX2 and plain x86-64 and picked by the CPU at load). It replaced a numba kernel of the same
speed whose LLVM cost every Ray worker ~150 MB. The numpy path stays as the reference (tests compare both
bit for bit) and the fallback: it runs when the extension was not built (no C compiler at install time),
when ``DATAHUB_MINHASH_COMPILED=0``, and for character shingles.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

import numpy as np

from datahub.settings import minhash_compiled

log = logging.getLogger("datahub.dedup")
_MODULE = "operators.dedup._minhash_c"
_kernel: ModuleType | None = None
_missing = False


def enabled() -> bool:
    """Whether signatures take the compiled path (extension built, not turned off by the environment)."""
    return minhash_compiled() and _load() is not None


def word_signatures(data: np.ndarray, offsets: np.ndarray, position_constants: np.ndarray, a: np.ndarray,
                    b: np.ndarray, width: int) -> np.ndarray | None:
    """``(n_docs, num_perm)`` signatures of word n-gram shingles (``n = len(position_constants)``), or None
    when the extension is missing (the caller then takes the numpy path)."""
    kernel = _load()
    if kernel is None:
        return None
    dtype = np.uint32 if width == 32 else np.uint64
    out = np.empty((len(offsets) - 1, len(a)), dtype=dtype)
    kernel.signatures(np.ascontiguousarray(data, dtype=np.uint8), np.ascontiguousarray(offsets, dtype=np.int64),
                      np.ascontiguousarray(position_constants, dtype=np.uint64), np.ascontiguousarray(a, dtype=dtype),
                      np.ascontiguousarray(b, dtype=dtype), out, width // 8)
    return out


def _load() -> ModuleType | None:
    global _kernel, _missing
    if _kernel is None and not _missing:
        try:
            _kernel = importlib.import_module(_MODULE)
        except ImportError as error:
            _missing = True
            log.warning("the compiled MinHash kernel is not built (%s): signatures use the numpy path, several times "
                        "slower; reinstall datahub where a C compiler is present (pip install -e .)", error)
    return _kernel
