"""``python -m loadtests.attacks``: the old module command of ``python -m loadtests attacks``, an alias
for this release (docs/reference/loadtests.md, "Old names"); the code is in
:mod:`loadtests.edge.attacks`."""
import sys

from loadtests.edge.attacks import main

if __name__ == "__main__":
    sys.exit(main())
