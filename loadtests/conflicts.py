"""``python -m loadtests.conflicts``: the old module command of ``python -m loadtests conflicts``, an alias
for this release (docs/reference/loadtests.md, "Old names"); the code is in
:mod:`loadtests.storage.conflicts`."""
import sys

from loadtests.storage.conflicts import main

if __name__ == "__main__":
    sys.exit(main())
