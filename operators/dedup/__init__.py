"""Exact and MinHash-LSH near-duplicate dedup. Importing registers ``exact_dedup`` and ``minhash_dedup``."""

from operators.dedup import exact_op, minhash_op  # noqa: F401  (registration)
