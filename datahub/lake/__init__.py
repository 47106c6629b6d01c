"""The Delta lake: tables, schemas, idempotent commits."""

from datahub.lake.lake import Lake

__all__ = ["Lake"]
