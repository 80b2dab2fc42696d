"""ConflictErrors per class and oid, from ZEO clients' event logs (issue 33;
docs/explanation/conflicts.md).

    python -m loadtests conflicts LOG [LOG ...] [--server-log ZEOSERVER_LOG ...] [--json]

Reads Zope event logs (``var/log/instance.log`` and the like; rotated ``.gz`` files too) and
counts the write conflicts that reached the client, per persistent class and oid:

- **retried**: ``INFO [Products.SiteErrorLog] ConflictError at <path>: database conflict
  error (oid 0x5f, class ...). Request will be retried.`` -- Zope aborted the request and
  published it again (``max-conflict-retries`` times at most, with a random back-off of up to
  1, 2, 4, ... s);
- **failed**: the ``ConflictError`` (or ``ReadConflictError``) that ends a traceback SiteErrorLog
  logs at ERROR level: the last retry conflicted too and the client answered 500. A lower
  bound: SiteErrorLog copies at most 5 errors of one kind a minute into the event log (its
  ``_rate_restrict_*``); the clients' metrics (``zodb_conflicts_total`` minus
  ``zope_request_retries_total``) and the access log's 500s count every one.

A conflict the storage resolved (BTrees buckets, ``BTrees.Length``, any class with
``_p_resolveConflict`` the resolving process can import) never reaches the client and is not
in its log. With ``--server-log`` the ZEO server's log is read too, for the conflicts it
**failed to resolve because it could not import the class**: ``Unexpected error while trying
to resolve conflict on <...BadClass...>`` (its ``[zeoserver]`` part lacks the site's eggs).

The report is one table, the hottest objects first: class, oid, retried, failed, the paths
of the requests (up to three). The class and oid are ZODB's own (``ConflictError.__str__``);
a conflict logged without them counts as class ``?``. A production log works as it is: the
lines are Zope's and SiteErrorLog's, not the kit's.

Exit status 0 (also when there were conflicts: this is a report, not a check); 2 when a log
cannot be read.
"""
import argparse
import collections
import gzip
import json
import re
import sys

#: SiteErrorLog's line for a conflict it lets Zope retry (IPubFailureSubscriber).
RETRIED = re.compile(r"\b(?P<kind>\w*ConflictError) at (?P<path>\S*): (?P<message>.*)\. Request will be retried\.")
#: The last line of a logged traceback whose exception is a conflict: the request failed.
FAILED = re.compile(r"^(?:[\w.]+\.)?(?P<kind>\w*ConflictError): (?P<message>.*)$")
#: The ZEO server's log line of a resolution that failed with an exception (a class it
#: could not import shows as BadClass).
SERVER_UNEXPECTED = re.compile(r"Unexpected error while trying to resolve conflict on (?P<what>.*)$")
OID = re.compile(r"\boid (?P<oid>0x[0-9a-fA-F]+)")
CLASS = re.compile(r"\bclass (?P<cls>[\w.]+)")
UNKNOWN = "?"


def _open(path):
    """Text lines of ``path`` (gzip when it ends in .gz); undecodable bytes replaced."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def identify(message):
    """``(class, oid)`` from a ConflictError's message, ``"?"`` for what it does not name."""
    oid, cls = OID.search(message), CLASS.search(message)
    return (cls.group("cls") if cls else UNKNOWN), (oid.group("oid") if oid else UNKNOWN)


def scan_client(lines):
    """Conflicts in the lines of a ZEO client's event log.

    Returns ``{(class, oid): {"retried": n, "failed": n, "paths": Counter}}``."""
    found = collections.defaultdict(lambda: {"retried": 0, "failed": 0, "paths": collections.Counter()})
    for line in lines:
        match = RETRIED.search(line)
        if match:
            entry = found[identify(match.group("message"))]
            entry["retried"] += 1
            entry["paths"][match.group("path")] += 1
            continue
        match = FAILED.match(line.strip())
        if match:
            found[identify(match.group("message"))]["failed"] += 1
    return dict(found)


def scan_server(lines):
    """``{"unexpected": n, "badclass": n}``: the ZEO server's failed resolutions, and of
    them those on a class it could not import (BadClass)."""
    counts = {"unexpected": 0, "badclass": 0}
    for line in lines:
        match = SERVER_UNEXPECTED.search(line)
        if match:
            counts["unexpected"] += 1
            counts["badclass"] += "BadClass" in match.group("what")
    return counts


def merge(into, more):
    """Add the counts of ``more`` (a :func:`scan_client` result) to ``into``; returns ``into``."""
    for key, entry in more.items():
        target = into.setdefault(key, {"retried": 0, "failed": 0, "paths": collections.Counter()})
        target["retried"] += entry["retried"]
        target["failed"] += entry["failed"]
        target["paths"].update(entry["paths"])
    return into


def summarize(found, server=None, logs=()):
    """The report's data from a :func:`scan_client` result (``found``) and an optional
    :func:`scan_server` result: ``{"objects": [row, ...], "retried": n, "failed": n,
    "server": {...} or None, "logs": [...]}``, rows (class, oid, retried, failed, up to
    three paths) sorted by retried + failed, the most first, then class and oid."""
    rows = [{"class": cls, "oid": oid, "retried": e["retried"], "failed": e["failed"],
             "paths": [p for p, _ in e["paths"].most_common(3)]}
            for (cls, oid), e in found.items()]
    rows.sort(key=lambda r: (-(r["retried"] + r["failed"]), r["class"], r["oid"]))
    return {"objects": rows, "retried": sum(r["retried"] for r in rows),
            "failed": sum(r["failed"] for r in rows), "server": server, "logs": list(logs)}


def read(client_logs, server_logs=()):
    """:func:`summarize` of the client log files ``client_logs`` and the ZEO server's
    ``server_logs`` (``server`` None when there are none). OSError when a file cannot be read."""
    found = {}
    for path in client_logs:
        with _open(path) as fp:
            merge(found, scan_client(fp))
    server = None
    if server_logs:
        server = {"unexpected": 0, "badclass": 0}
        for path in server_logs:
            with _open(path) as fp:
                for key, value in scan_server(fp).items():
                    server[key] += value
    return summarize(found, server, list(client_logs) + list(server_logs))


def to_markdown(data, limit=20):
    """The report as Markdown: one line of totals and the table of the ``limit`` hottest
    objects (``0``: all)."""
    from loadtests.core.reports import markdown_table

    rows = data["objects"] if not limit else data["objects"][:limit]
    lines = [f"ConflictErrors in the clients' logs: {data['retried']:,} retried, {data['failed']:,} failed "
             f"(at least; the request answered 500 after its last retry), on {len(data['objects'])} object(s)."]
    if data["server"] is not None:
        lines.append(f"ZEO server: {data['server']['unexpected']:,} resolution(s) failed with an error, "
                     f"{data['server']['badclass']:,} of them on a class it could not import (BadClass).")
    if rows:
        lines += ["", markdown_table(["class", "oid", "retried", "failed", "paths"],
                                     [[r["class"], r["oid"], r["retried"], r["failed"], " ".join(r["paths"])]
                                      for r in rows])]
        if len(rows) < len(data["objects"]):
            lines.append(f"\n({len(data['objects']) - len(rows)} more objects with fewer conflicts.)")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests conflicts",
        description="ConflictErrors per class and oid from ZEO clients' event logs (retried, and failed "
        "after the last retry); with --server-log also the ZEO server's failed resolutions (BadClass).")
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="Zope event logs of the clients, e.g. var/log/instance.log (.gz read too)")
    parser.add_argument("--server-log", action="append", default=[], metavar="LOG",
                        help="the ZEO server's log, e.g. var/log/zeoserver.log (repeatable)")
    parser.add_argument("--limit", type=int, default=20,
                        help="objects shown, the hottest first (default 20; 0: all)")
    parser.add_argument("--json", action="store_true", help="print the data as JSON instead of Markdown")
    return parser.parse_args(argv)


def main(argv=None):
    """Print the conflict report of the logs in ``argv``; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        data = read(args.logs, args.server_log)
    except OSError as exc:
        print(f"conflicts: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=2) if args.json else to_markdown(data, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
