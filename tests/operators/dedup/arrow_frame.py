"""Re-export: ``ArrowFrame`` moved to ``datahub.engines.arrow`` (benchmarks use it too)."""

from datahub.engines.arrow import ArrowFrame

__all__ = ["ArrowFrame"]
