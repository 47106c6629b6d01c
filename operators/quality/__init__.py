"""Quality operators: signals in the ``quality`` struct, optional drops with reasons."""

from operators.quality import c4, fineweb, gopher, language, length, pii  # noqa: F401  (registration)
