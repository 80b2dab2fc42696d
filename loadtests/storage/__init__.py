"""``python -m loadtests storage`` (``storagebench``: ZEO vs RelStorage on stacks of its own)
and ``python -m loadtests conflicts`` (``conflicts``: ConflictErrors from the clients' logs)."""
