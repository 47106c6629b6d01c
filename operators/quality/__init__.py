"""Quality operators: signals in the ``quality`` struct, optional drops with reasons."""
