"""``python -m loadtests.matrix``: the old module command of ``python -m loadtests matrix``,
an alias for this release (docs/reference/loadtests.md, "Old names")."""
import sys

from loadtests.matrix.matrix import main

if __name__ == "__main__":
    sys.exit(main())
