"""Ray Data engine."""

from datahub.engines.ray.engine import RayEngine, RayFrame

__all__ = ["RayEngine", "RayFrame"]
