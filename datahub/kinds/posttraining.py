"""The post-training kinds ``chat``, ``preference`` and ``trajectory``. Implemented by issue 18's work."""
