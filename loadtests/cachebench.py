"""``python -m loadtests.cachebench``: the old module command of ``python -m loadtests cache``, an alias
for this release (docs/reference/loadtests.md, "Old names"); the code is in
:mod:`loadtests.cache.cachebench`."""
import sys

from loadtests.cache.cachebench import main

if __name__ == "__main__":
    sys.exit(main())
