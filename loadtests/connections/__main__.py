"""``python -m loadtests.connections``: the old module command of ``python -m loadtests connections``,
an alias for this release (docs/reference/loadtests.md, "Old names")."""
import sys

from loadtests.connections.connections import main

if __name__ == "__main__":
    sys.exit(main())
