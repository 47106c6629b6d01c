"""The operator library. Importing it registers every operator and reader by name."""

from operators import clean, decontam, dedup, ingest, media, posttraining, quality  # noqa: F401  (registration side effect)
