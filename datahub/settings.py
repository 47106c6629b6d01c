"""The process settings datahub takes from the environment, each read here and nowhere else.

Job configuration comes from specs (``${VAR}`` expansion in ``datahub.config.spec``) and arguments; these are
the few switches that belong to a process, not to a job. Each function takes an optional mapping so that
callers and tests can pass their own environment.

| variable | read by | meaning |
| --- | --- | --- |
| ``DATAHUB_MINHASH_COMPILED`` | ``minhash_compiled`` | ``0`` turns the C MinHash kernel off (numpy path) |
| ``DATAHUB_PROGRESS`` | ``progress_forced`` | ``1`` shows terminal progress bars even when not a TTY |
| ``DATAHUB_ALLOCATOR`` | ``allocator`` | ``system`` (default) or ``arrow``: memory allocator of the CLI |
| ``DATAHUB_REGION`` | ``region`` | the loader's region: replicas there are read first |
| ``DATAHUB_RAY_NUM_CPUS`` | ``ray_num_cpus`` | CPUs of an embedded Ray when the job names none (default: the CPUs this process may use) |
| ``DATAHUB_TEST_KILL_AT`` | ``kill_at`` | fault injection for crash-safety tests: checkpoints to SIGKILL at |
| ``XDG_CACHE_HOME`` | ``cache_home`` | the user's cache directory (default ``~/.cache``): the loader's sha256 verdicts |

Tier credentials are read from the variables a storage config names (``datahub.storage.tier``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from datahub.errors import SpecError

MINHASH_COMPILED_ENV = "DATAHUB_MINHASH_COMPILED"
PROGRESS_ENV = "DATAHUB_PROGRESS"
ALLOCATOR_ENV = "DATAHUB_ALLOCATOR"
REGION_ENV = "DATAHUB_REGION"
RAY_NUM_CPUS_ENV = "DATAHUB_RAY_NUM_CPUS"
KILL_AT_ENV = "DATAHUB_TEST_KILL_AT"
CACHE_HOME_ENV = "XDG_CACHE_HOME"


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def minhash_compiled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the compiled MinHash kernel may be used (``DATAHUB_MINHASH_COMPILED`` is not ``0``)."""
    return _env(environ).get(MINHASH_COMPILED_ENV, "1") != "0"


def progress_forced(environ: Mapping[str, str] | None = None) -> bool:
    """Whether terminal progress bars are forced on (``DATAHUB_PROGRESS=1``)."""
    return _env(environ).get(PROGRESS_ENV) == "1"


def allocator(environ: Mapping[str, str] | None = None) -> str:
    """The CLI's allocator choice as given (``DATAHUB_ALLOCATOR``, default ``system``), lower-cased."""
    return _env(environ).get(ALLOCATOR_ENV, "system").strip().lower() or "system"


def region(environ: Mapping[str, str] | None = None) -> str | None:
    """The reader's region (``DATAHUB_REGION``; empty: none)."""
    return _env(environ).get(REGION_ENV) or None


def ray_num_cpus(environ: Mapping[str, str] | None = None) -> int | None:
    """CPUs of an embedded Ray when the job's ``engine.num_cpus`` is not set (``DATAHUB_RAY_NUM_CPUS``), or None."""
    value = _env(environ).get(RAY_NUM_CPUS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise SpecError(f"{RAY_NUM_CPUS_ENV}={value!r}: expected a whole number of CPUs >= 1 (e.g. "
                         f"{RAY_NUM_CPUS_ENV}=4), or unset it to use the CPUs this process may run on")
    return int(value)


def kill_at(environ: Mapping[str, str] | None = None) -> str | None:
    """The armed fault-injection checkpoints (``DATAHUB_TEST_KILL_AT``), or None."""
    return _env(environ).get(KILL_AT_ENV) or None


def cache_home(environ: Mapping[str, str] | None = None) -> str:
    """The user's cache directory: ``XDG_CACHE_HOME`` (the XDG base directory spec; a relative path is ignored, as
    the spec says), else ``~/.cache``."""
    value = _env(environ).get(CACHE_HOME_ENV) or ""
    return value if os.path.isabs(value) else os.path.join(os.path.expanduser("~"), ".cache")
