"""``python tests/multihost [--keep] [--storage zeo|relstorage]`` (root), or ``python -m
multihost`` with tests/ as the working directory: runs main.main()."""
import os
import sys

if not __package__:  # python tests/multihost: the package's folder is sys.path[0], not its parent
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from multihost.main import main  # noqa: E402  (after the path above)

sys.exit(main())
