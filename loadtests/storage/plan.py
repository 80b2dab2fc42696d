"""The storage benchmark's plan: the variants, the paths and the write lane, each variant's
ports, and the order of the runs (``plan``).
"""
import os

from loadtests.core.stack import PATHS, ROOT

#: The [postgresql] settings of the rs-pg-tuned variant: twice the default shared buffers
#: (the demo database, ~20 MB, fits either way), a larger sort memory, generic plans for
#: RelStorage's prepared statements (no re-planning per execution) and no JIT.
PG_TUNED = ["settings =", "    shared_buffers = 256MB", "    work_mem = 16MB",
            "    plan_cache_mode = force_generic_plan", "    jit = off"]

#: The variants: name -> (config extended, extra lines of [instance], extra lines of
#: [postgresql]). The ``rs-*`` ones are the RelStorage tuning of issue 32, one setting each
#: and ``rs-tuned`` the promising ones together; each names its setting explicitly, so it
#: keeps its meaning whatever relstorage.cfg's defaults become
#: (docs/how-to/relstorage.md#tuning).
VARIANTS = {
    "zeo": ("buildout.cfg", [], []),
    "relstorage": ("relstorage.cfg", ["relstorage-blobs = database"], []),
    "relstorage-shared": ("relstorage.cfg", ["relstorage-blobs = shared-directory"], []),
    "rs-explicit": ("relstorage.cfg", ["relstorage-blobs = database", "transaction-mode = explicit"], []),
    # Zope's stock mode, relstorage.cfg's default until 29 Nov 2026 (since then explicit)
    "rs-implicit": ("relstorage.cfg", ["relstorage-blobs = database", "transaction-mode = implicit"], []),
    "rs-cache-100mb": ("relstorage.cfg", ["relstorage-blobs = database", "relstorage-cache-local-mb = 100"], []),
    "rs-cache-dir": ("relstorage.cfg", ["relstorage-blobs = database",
                                        "relstorage-cache-local-dir = ${buildout:directory}/var/relstorage-cache"],
                     []),
    "rs-blob-cache-1gb": ("relstorage.cfg", ["relstorage-blobs = database", "relstorage-blob-cache-size = 1GB"], []),
    "rs-pg-tuned": ("relstorage.cfg", ["relstorage-blobs = database"], PG_TUNED),
    "rs-tuned": ("relstorage.cfg", ["relstorage-blobs = database", "transaction-mode = explicit",
                                    "relstorage-cache-local-mb = 100",
                                    "relstorage-cache-local-dir = ${buildout:directory}/var/relstorage-cache"],
                 PG_TUNED),
}
#: What ``--variants`` defaults to (``make storagebench``): the storages and blob modes.
DEFAULT_VARIANTS = ("zeo", "relstorage", "relstorage-shared")
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

def blobs_in_database(variant):
    """True if ``variant`` is a RelStorage one with its blobs in PostgreSQL (its client's
    blob directory is then a cache)."""
    extends, instance_lines, _ = VARIANTS[variant]
    return variant != BASELINE and "relstorage-blobs = database" in instance_lines


def ports(base_port, index):
    """``{[ports] key: port}`` of variant number ``index`` (0-based) from ``base_port``."""
    return {key: base_port + PORT_STRIDE * index + offset for key, offset in PORT_OFFSETS.items()}


def plan(rounds, labels, counts, variants):
    """The runs in order: ``[(round, label, connections, variant)]``.

    Groups are the (label, connections) pairs; each round runs every group once, the group
    order shifted by one per round; within a group every variant runs once, right after each
    other (so a round's ratio compares runs seconds apart), in ``variants``' order rotated by
    the group's number plus the round's: over ``len(variants)`` rounds each variant runs in
    each place of each group once. (Rotating by the group's place in the round instead, as
    until 28 Nov 2026, cancelled the group shift: every group kept its order in every round,
    and the storage run of 28 Nov had ``rs-explicit`` first on ``@json`` in all three.)"""
    groups = [(label, n) for n in counts for label in labels]
    numbered = list(enumerate(groups))
    runs = []
    for number in range(1, rounds + 1):
        shift = (number - 1) % len(groups)
        for index, (label, n) in numbered[shift:] + numbered[:shift]:
            start = (number - 1 + index) % len(variants)
            runs += [(number, label, n, v) for v in variants[start:] + variants[:start]]
    return runs
