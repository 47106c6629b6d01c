"""Memory allocator settings of the CLI's post-lake commands (qa, report, export, release, tier, lineage).

Those commands stream a release batch by batch; what grows with the release is then freed memory the allocators
keep, not data held. Arrow's default pool (mimalloc or jemalloc) keeps freed decode buffers, and glibc malloc
raises its mmap threshold to the largest block freed (up to 32 MB), so later buffers come from a heap trimmed
only from its top. ``use_system_allocator`` puts Arrow on malloc and fixes glibc's mmap/trim thresholds at
128 kB (the Ray workers' ``MALLOC_ENV``), so freed batches go back to the system: measured with
``benchmarks/release_scale.py``, qa's peak grows 1.11x and export's 1.24x for 4x the data instead of 1.5-1.7x.

The setting is ``DATAHUB_ALLOCATOR`` (read in ``datahub.settings``): ``system`` (the default) or ``arrow`` (keep Arrow's
own allocator and glibc's defaults, e.g. for a quick comparison). Variables the user set themselves
(``ARROW_DEFAULT_MEMORY_POOL``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

from datahub import settings
from datahub.errors import DatahubError

ALLOCATORS = ("system", "arrow")
MALLOC_THRESHOLD = 131072

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# inside ``arrow_pool``: above the largest per-batch temporaries of an export's pass (a 4096-row batch's header
# blocks are 2 MB; its index arrays a few MB), so they come from the heap and reuse its pages
_BLOCK_MMAP_THRESHOLD = 32 * 2**20


def use_system_allocator(environ: MutableMapping[str, str] | None = None) -> bool:
    """Put Arrow on the system allocator with fixed glibc thresholds unless ``DATAHUB_ALLOCATOR=arrow``.

    Call before pyarrow allocates (Arrow reads ``ARROW_DEFAULT_MEMORY_POOL`` at its first allocation). The
    variables also reach the processes the command starts (Ray's and Spark's workers); this process gets the
    glibc thresholds through ``mallopt``, since glibc reads ``MALLOC_*_`` only at exec. True when applied.
    """
    env = os.environ if environ is None else environ
    choice = settings.allocator(env)
    if choice not in ALLOCATORS:
        name = settings.ALLOCATOR_ENV
        raise DatahubError(f"{name}={env[name]!r} is not an allocator setting; use one of {', '.join(ALLOCATORS)} "
                           "(system: Arrow on malloc, freed memory returned; arrow: Arrow's own allocator)")
    if choice == "arrow":
        return False
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    # glibc applied the user's own MALLOC_*_ at exec; only the ones set here need mallopt
    unset = [name for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_") if name not in env]
    for name in unset:
        env[name] = str(MALLOC_THRESHOLD)
    if unset and environ is None and sys.platform.startswith("linux"):
        _mallopt([_M_MMAP_THRESHOLD if name.startswith("MALLOC_MMAP") else _M_TRIM_THRESHOLD for name in unset])
    return True


def _mallopt(parameters: list[int]) -> None:
    """glibc's ``parameters`` set to MALLOC_THRESHOLD in this process; a no-op on a libc without ``mallopt``."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    for parameter in parameters:
        mallopt(parameter, MALLOC_THRESHOLD)


@contextmanager
def arrow_pool() -> Iterator[None]:
    """Arrow's own pool (mimalloc, else jemalloc) as Arrow's default while the block runs, then its unused pages
    released and the previous default back.

    For a stage that decodes and encodes batch after batch of about one size (the local export's pass over the
    release): the pool hands the next batch the pages the last one freed, where malloc with the CLI's fixed 128 kB
    mmap threshold maps fresh pages for every large buffer and faults each one in (on the L lake of
    ``benchmarks/release_scale.py`` the pass took 19.6 s on malloc, 10.9 s on mimalloc). Memory stays what the
    stage holds (a few batches), whatever the release's size. Buffers remember their pool, so the ones that
    outlive the block are freed correctly.

    Where this process runs glibc with the CLI's fixed 128 kB thresholds (``use_system_allocator``), the block also
    raises them (``_BLOCK_MMAP_THRESHOLD``), so numpy's per-batch temporaries above 128 kB reuse heap memory instead
    of a fresh mapping each (L of the benchmark: 720k -> 120k page faults, sys 6.5 -> 5.0 s); after the block
    the thresholds go back and the heap is trimmed.
    """
    import pyarrow as pa

    previous = pa.default_memory_pool()
    pool = None
    for make in (getattr(pa, "mimalloc_memory_pool", None), getattr(pa, "jemalloc_memory_pool", None)):
        try:
            pool = make() if make is not None else None
        except NotImplementedError:  # a pyarrow built without it
            continue
        if pool is not None:
            break
    with _raised_malloc_thresholds():
        if pool is None or pool.backend_name == previous.backend_name:
            yield
            return
        pa.set_memory_pool(pool)
        try:
            yield
        finally:
            pa.set_memory_pool(previous)
            pool.release_unused()


@contextmanager
def _raised_malloc_thresholds() -> Iterator[None]:
    """glibc's mmap threshold at ``_BLOCK_MMAP_THRESHOLD`` (trim threshold twice that) while the block runs, when
    the process has the fixed ``MALLOC_THRESHOLD`` (else glibc's own or the user's settings are left alone);
    restored and the heap trimmed after."""
    fixed = os.environ.get("MALLOC_MMAP_THRESHOLD_") == str(MALLOC_THRESHOLD) and sys.platform.startswith("linux")
    libc = ctypes.CDLL(None) if fixed else None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        yield
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(_M_MMAP_THRESHOLD, _BLOCK_MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, 2 * _BLOCK_MMAP_THRESHOLD)
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, MALLOC_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, _env_threshold("MALLOC_TRIM_THRESHOLD_"))  # the user's own, if they set one
        trim = getattr(libc, "malloc_trim", None)
        if trim is not None:
            trim.argtypes = [ctypes.c_size_t]
            trim(0)


def _env_threshold(name: str) -> int:
    """The glibc threshold this process runs with for ``name`` (its environment value, which the CLI sets to
    ``MALLOC_THRESHOLD`` unless the user gave one), or ``MALLOC_THRESHOLD`` when it is not a number."""
    try:
        return int(os.environ.get(name, MALLOC_THRESHOLD))
    except ValueError:
        return MALLOC_THRESHOLD
