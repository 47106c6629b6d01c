"""Sample kinds: what one row of ``samples`` is (plain text, an image with its caption, a chat, ...).

One ``samples`` table holds every kind. A row's kind is in the ``kind`` column (absent or null means
``text``; a text-only job does not write the column). Each kind is a :class:`KindSpec` registered by
its own module (``text``, ``media``, ``posttraining``) and declares:

- ``fields``: its own typed, nullable Arrow columns (null on rows of other kinds);
- ``sample_ids``: its content identity, a pure function of the row's content (documented per kind);
- optional export ``members``: extra WebDataset members built from its columns (e.g. the image as
  ``.jpg``), whose source columns (``member_columns``) are then left out of the ``.json`` member.

Every kind also fills ``text``: the text that text operators (quality filters, MinHash) see, e.g. the
caption of an image or a canonical rendering of a conversation.
"""

from __future__ import annotations

from datahub.kinds import media as _media  # noqa: F401  (the kinds' own modules register themselves)
from datahub.kinds import posttraining as _posttraining  # noqa: F401
from datahub.kinds import text as _text  # noqa: F401
from datahub.kinds.base import KindSpec, kind_spec, kinds_of, register_kind, registered_kinds, row_fields
from datahub.kinds.names import DEFAULT_KIND, KIND_COLUMN, KINDS, Kind

__all__ = ["DEFAULT_KIND", "KIND_COLUMN", "KINDS", "Kind", "KindSpec", "kind_spec", "kinds_of", "register_kind",
           "registered_kinds", "row_fields"]
