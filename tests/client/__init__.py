"""Scripts that tests run inside a built ZEO client's own interpreter
(``parts/instance/bin/interpreter``), where the client's eggs are importable; no pytest
module (none of its files is named ``test_*``), so pytest collects nothing here.

- ``blobfilter_checks``: tests/test_blobfilter.py's checks against the real classes of the
  client's eggs.
"""
