"""``python -m loadtests.storagebench``: the old module command of ``python -m loadtests storage``, an alias
for this release (docs/reference/loadtests.md, "Old names"); the code is in
:mod:`loadtests.storage.storagebench`."""
import sys

from loadtests.storage.storagebench import main

if __name__ == "__main__":
    sys.exit(main())
