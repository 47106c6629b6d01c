"""An export's scratch folders: the locked, swept folders of ``datahub.lake.scratch`` under the export's prefixes."""

from __future__ import annotations

from datahub.lake.scratch import LOCK_NAME, scratch_dir, sweep_stale

__all__ = ["EXPORT_PREFIX", "LOCK_NAME", "TOKENS_PREFIX", "scratch_dir", "sweep_stale"]

EXPORT_PREFIX = "datahub-export-"
TOKENS_PREFIX = "datahub-tokens-"
