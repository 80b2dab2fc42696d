"""Which classes can the ZEO server import and resolve conflicts of, and what it costs.

    PYTHONPATH=$(sed -n 's/^PYTHONPATH="\\(.*\\)"/\\1/p' parts/zeoserver/bin/runzeo) \\
        .venv-buildout/bin/python3 scripts/zeo_resolvable.py CLASS [CLASS ...]

Run with the ZEO server's own path (its ``parts/zeoserver/bin/runzeo`` sets PYTHONPATH), it
looks each dotted class name up as ZODB's conflict resolution does
(``ZODB.ConflictResolution.find_global``) and prints whether the server can import it
("BadClass" when not: every conflict on it then goes back to the client, with a traceback in
the server's log) and whether it has ``_p_resolveConflict``; last, the process's resident
memory (MiB, /proc/self/status) after importing ZEO.runzeo and after the classes, i.e. what
the imports cost the server once. Exit status 0; 2 without a class name.
docs/explanation/conflicts.md has the figures of buildout.cfg's [zeoserver].
"""
import sys


def rss_mib():
    """Resident memory of this process in MiB (VmRSS)."""
    with open("/proc/self/status", encoding="ascii") as fp:
        return int(next(line for line in fp if line.startswith("VmRSS")).split()[1]) / 1024


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    import ZEO.runzeo  # noqa: F401 -- what the server has loaded before its first conflict
    from ZODB.ConflictResolution import find_global

    base = rss_mib()
    for name in argv:
        module, _, cls = name.rpartition(".")
        found = find_global(module, cls)
        print(f"{name}: {'importable' if isinstance(found, type) else 'BadClass'}, "
              f"_p_resolveConflict {'yes' if hasattr(found, '_p_resolveConflict') else 'no'}")
    print(f"RSS {base:.1f} MiB after ZEO.runzeo, {rss_mib():.1f} MiB after importing the {len(argv)} classes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
