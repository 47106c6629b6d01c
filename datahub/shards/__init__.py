"""The shard format, shared by the writer (``datahub.export``) and the reader (``datahub.loader``).

- ``tar``: deterministic ustar members and end-of-archive (what export writes);
- ``index``: a shard's sample index (its embedded ``__index__`` member, or parsed from the headers);
- ``manifest``: the one ``Manifest`` model of an exported release, and where it is published.
"""
