"""``python -m loadtests.abtest``: the old module command of ``python -m loadtests ab``, an alias
for this release (docs/reference/loadtests.md, "Old names"); the code is in
:mod:`loadtests.ab.abtest`."""
import sys

from loadtests.ab.abtest import main

if __name__ == "__main__":
    sys.exit(main())
