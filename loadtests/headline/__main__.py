"""``python -m loadtests.headline``: the old module command of ``python -m loadtests headline``,
an alias for this release (docs/reference/loadtests.md, "Old names")."""
import sys

from loadtests.headline.headline import main

if __name__ == "__main__":
    sys.exit(main())
