"""``python -m multihost [--keep] [--storage zeo|relstorage]`` (root) with tests/ as the
working directory (``make multihost``): runs main.main()."""
import sys

from multihost.main import main

sys.exit(main())
