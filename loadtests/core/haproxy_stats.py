"""Read HAProxy's stats CSV (``/stats;csv``) and compute per-server counter deltas.

HAProxy's CSV has one row per proxy/server; the columns used here are documented in the
HAProxy management guide ("CSV format"). For the A/B share, ``stot`` (sessions) and
``hrsp_2xx`` are the right counters: ``lbtot`` undercounts requests that waited in the
backend queue.
"""
import csv
import io
import urllib.request

#: Cumulative per-server counters whose difference over a run is reported.
COUNTERS = (
    "stot",       # sessions (one per request: HAProxy closes server connections)
    "hrsp_1xx", "hrsp_2xx", "hrsp_3xx", "hrsp_4xx", "hrsp_5xx", "hrsp_other",
    "bin",        # bytes from clients (requests)
    "bout",       # bytes to clients (responses)
    "econ",       # connection errors to the server
    "eresp",      # response errors
    "wretr",      # retries
    "wredis",     # redispatches to another server
    "cli_abrt",   # transfers aborted by the client
    "srv_abrt",   # transfers aborted by the server
    "chkfail",    # failed health checks
)


def fetch(url, timeout=5.0):
    """Return the stats CSV at ``url`` as a list of dicts (one per row, column -> string).

    Raises OSError (urllib.error.URLError) if the stats page does not answer.
    """
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode("utf-8")
    return list(csv.DictReader(io.StringIO(text.lstrip("# "))))


def servers(rows, backend):
    """Return ``{server name: row}`` for the servers (not the BACKEND row) of ``backend``."""
    return {
        row["svname"]: row
        for row in rows
        if row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND")
    }


def backend_row(rows, backend):
    """The BACKEND row (column -> string) of ``backend`` in a ``fetch`` result; raises
    StopIteration when the stats have no such backend."""
    return next(r for r in rows if r["pxname"] == backend and r["svname"] == "BACKEND")


def _int(value):
    return int(value) if value not in (None, "") else 0


def deltas(before, after, backend):
    """Per-server counter increase between two ``fetch`` results.

    Returns ``{server: {counter: int, ..., "status": status after the run}}`` for the
    servers of ``backend`` present in ``after``; a server missing in ``before`` counts
    from 0.
    """
    first = servers(before, backend)
    result = {}
    for name, row in servers(after, backend).items():
        base = first.get(name, {})
        result[name] = {c: _int(row.get(c)) - _int(base.get(c)) for c in COUNTERS}
        result[name]["status"] = row.get("status", "")
    return result


def frontend_5xx(rows):
    """Sum of ``hrsp_5xx`` over the FRONTEND rows of a stats fetch, the stats listener
    excluded: every 5xx the clients got, HAProxy's own 503s (queue timeout, no server up)
    included, which the servers' rows do not count."""
    return sum(_int(r["hrsp_5xx"]) for r in rows if r["svname"] == "FRONTEND" and r["pxname"] != "stats")
