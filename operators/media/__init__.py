"""Image operators (kind ``image_text``): verify, filter, resize, perceptual hash, near-duplicate dedup.

Importing registers ``image_verify``, ``image_filter``, ``image_resize``, ``image_hash``, ``image_exact_dedup`` and
``image_dedup``.
"""

from operators.media import dedup, exact, filters  # noqa: F401  (registration)
