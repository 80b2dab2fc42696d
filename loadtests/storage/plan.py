"""The storage benchmark's plan: the variants, the paths and the write lane, each variant's
ports, and the order of the runs (``plan``).
"""
import os

from loadtests.core.stack import PATHS, ROOT


#: The variants: name -> (config extended, extra lines of [instance]).
VARIANTS = {
    "zeo": ("buildout.cfg", []),
    "relstorage": ("relstorage.cfg", ["relstorage-blobs = database"]),
    "relstorage-shared": ("relstorage.cfg", ["relstorage-blobs = shared-directory"]),
}
BASELINE = "zeo"
#: The path labels: core.PATHS' four reads and the write path.
WRITE = "write"
LABELS = tuple(PATHS) + (WRITE,)
WRITE_FOLDER = "bench-writes"
#: Port offsets in each variant's block of PORT_STRIDE ports. Every port of buildout.cfg's
#: [ports] is moved, also those of parts not built here, so nothing lands on the demo's.
PORT_OFFSETS = {"zeoserver": 0, "postgresql": 0, "instance": 1, "haproxy": 2, "stats": 3, "tls": 4,
                "instance-metrics": 5, "client2": 6, "uploads": 7, "client2-metrics": 8,
                "uploads-metrics": 9, "varnish": 10, "cache-fill": 11, "varnish-metrics": 12}
PORT_STRIDE = 15
PG_BIN = "/usr/lib/postgresql/15/bin"
DEFAULT_WORK_DIR = os.path.join(ROOT, "var", "storagebench")


# ----------------------------------------------------------------------------- plan

def ports(base_port, index):
    """``{[ports] key: port}`` of variant number ``index`` (0-based) from ``base_port``."""
    return {key: base_port + PORT_STRIDE * index + offset for key, offset in PORT_OFFSETS.items()}


def plan(rounds, labels, counts, variants):
    """The runs in order: ``[(round, label, connections, variant)]``.

    Groups are the (label, connections) pairs; each round runs every group once, the group
    order shifted by one per round; within a group every variant runs once, right after each
    other (so a round's ratio compares runs seconds apart), starting with a different variant
    from group to group and round to round."""
    groups = [(label, n) for n in counts for label in labels]
    runs = []
    for number in range(1, rounds + 1):
        shift = (number - 1) % len(groups)
        for position, (label, n) in enumerate(groups[shift:] + groups[:shift]):
            start = (number - 1 + position) % len(variants)
            runs += [(number, label, n, v) for v in variants[start:] + variants[:start]]
    return runs
