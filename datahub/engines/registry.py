"""Engines by name (``engine: {kind: ray | spark}``); each is imported when asked for, so ``import datahub``
imports neither ray nor pyspark."""

from __future__ import annotations

import importlib
from contextlib import ExitStack
from typing import TYPE_CHECKING

from datahub.errors import SpecError

if TYPE_CHECKING:
    from datahub.config.spec import EngineSpec
    from datahub.engines.base import Engine

# kind -> (module, class): one entry per engine, never overwritten
ENGINES: dict[str, tuple[str, str]] = {
    "ray": ("datahub.engines.ray", "RayEngine"),
    "spark": ("datahub.engines.spark", "SparkEngine"),
}


def make_engine(spec: EngineSpec) -> Engine:
    """The engine ``spec.kind`` names, not started."""
    try:
        module, name = ENGINES[spec.kind]
    except KeyError:
        raise SpecError(f"engine.kind: unknown engine {spec.kind!r}; use one of {sorted(ENGINES)}") from None
    engine: Engine = getattr(importlib.import_module(module), name)(spec)
    return engine


def engine_in_scope(engine: str | Engine, scope: ExitStack, *, purpose: str) -> Engine | None:
    """The engine a post-lake command runs on: None for ``"local"`` (this process); a name is started here and
    stopped when ``scope`` closes; a running Engine is used as it is. ``purpose`` names the command in errors."""
    if engine == "local":
        return None
    if isinstance(engine, str):
        from datahub.config.spec import EngineSpec

        running = make_engine(EngineSpec(kind=engine))
        running.start()
        scope.callback(running.stop)
    else:
        running = engine
    if running.name not in ENGINES:
        raise SpecError(f"--engine {running.name!r}: {purpose} runs on local, {' or '.join(sorted(ENGINES))}")
    return running
