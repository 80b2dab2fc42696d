"""The benchmark matrix's plan: cells, the randomized run order, resume, the estimate.

Pure functions (no processes, no network) used by loadtests/matrix/matrix.py and tested by
tests/test_matrix.py.

A *cell* is a :class:`Cell` ``(server, threads, path, connections, clients, sendfile)``:
one wsgi-server value with one ``threads`` setting, one path label (``/``, ``/Plone``,
``@json``, ``blob``, ``hello``, ``logged-in``), one wrk connection count (for ``logged-in``:
editors, Locust users), and the two axes that the
``scaling`` and ``blob`` subcommands vary: ``clients`` (0: wrk talks to one ZEO client
directly; n >= 1: to a temporary HAProxy over n ZEO clients of that server) and
``sendfile`` (the ZEO clients' ``blob-sendfile``; off only matters for the blob), and
``cache``: the ZEO clients' ``zodb-cache-size`` (objects per ZODB connection; 0: the
build's, loadtests.matrix.serverbuild.ZODB_CACHE_SIZE). A *run*
is ``(cell, index)`` with ``index`` in ``range(runs)``. A *part* is a :class:`Part`: one
ZEO client of the build.
"""
import collections
import json
import math
import random

from loadtests.loggedin import DOCUMENTS, LOGGED_IN

SINGLE_THREADED_DEFAULT = 1
MULTI_THREADED_DEFAULT = 2
#: Seconds a run costs besides wrk's duration (wrk start and exit, psutil samples, the
#: idle wait before it: at least 0.3 s), and a cell besides its warm-up; at 500 and more
#: connections on a Zope path the idle wait is longer (the requests wrk abandoned are
#: still served). Measured here with 2 s runs, 8 servers, 10 and 1,000 connections, on a
#: machine 60-75 % busy with other work: 0.5 s, and 2.8 s more at 1,000 on "/".
RUN_OVERHEAD_S = 0.5
HIGH_CONNECTIONS = 500
HIGH_DRAIN_S = 2.5
#: /Plone pages per second one ZEO client serves (about 25 ms CPU each, one core): after a
#: run at 1,000 connections its abandoned requests take about 1,000 / 40 = 25 s.
SLOW_PAGE_RPS = 40.0
CELL_OVERHEAD_S = 0.3
#: Requests/s one ZEO client at 2 threads serves per path here (busy 2-core machine, the
#: headline and matrix runs of 22-24 Nov 2026, rounded down): used only to estimate how
#: long steady-state runs take before anything is measured; the runs themselves size
#: their duration from the cell's own warm-up or previous run.
RATE_GUESS = {"hello": 2000.0, "/": 800.0, "@json": 100.0, "/Plone": SLOW_PAGE_RPS, "blob": 150.0,
              LOGGED_IN: 15.0}
#: Seconds a Locust run of the logged-in shape costs besides its counted duration: Locust's
#: start and the editors' logins in its uncounted warm-up (3 s; the headline's estimate).
LOCUST_OVERHEAD_S = 6.0
#: The most connections (editors) a path runs at: the logged-in shape's editors each save a
#: document of their own only up to DOCUMENTS of them (more would save the same documents at
#: once: ZODB write conflicts, not the server's speed). Cells above are left out of the plan.
PATH_MAX_CONNECTIONS = {LOGGED_IN: DOCUMENTS}
#: Seconds to build (when built: ~20 s) and start the parts, all at once: 8 parts (16
#: servers) answered after 122 s here on a busy shared 2-core machine.
STARTUP_BASE_S = 40.0
#: Seconds to start a temporary HAProxy for a balanced run and see its servers pass a
#: health check (its ``inter`` is 2 s).
BALANCER_START_S = 2.5
STARTUP_PER_PART_S = 12.0


#: One cell; ``clients`` 0, ``sendfile`` True and ``cache`` 0 are the direct, default-built
#: ZEO client (what a matrix measured before these axes, so its old records read as such).
Cell = collections.namedtuple("Cell", "server threads path connections clients sendfile cache",
                              defaults=(0, True, 0))
#: One ZEO client part of the build: ``replica`` 1..n for the n clients of a balanced cell;
#: ``cache``: its zodb-cache-size, 0 for the build's.
Part = collections.namedtuple("Part", "server threads sendfile replica cache", defaults=(True, 1, 0))


def default_threads(server, single_threaded):
    """``threads`` of ``server`` outside the sweep: 1 if single-threaded, else 2."""
    return SINGLE_THREADED_DEFAULT if server in single_threaded else MULTI_THREADED_DEFAULT


def cells(servers, paths, connections, threads, sweep_at, single_threaded, clients=(0,), sendfile=(True,),
          caches=(0,)):
    """All cells of the matrix, in a stable order (list of :class:`Cell`).

    Every server x path x connection level runs at the server's default threads (2, or 1
    for ``single_threaded`` servers); at ``sweep_at`` connections (if it is one of
    ``connections``) every value of ``threads`` runs too (only 1 for single-threaded
    servers). ``sweep_at`` None: every connection level runs every ``threads`` value. A path
    runs only at connection levels up to its PATH_MAX_CONNECTIONS (``logged-in``: 40).
    Each of those runs once per ``clients`` value (0: direct; n: through HAProxy over n
    ZEO clients) and, on the blob only, once per ``sendfile`` value (booleans; the other
    paths never reach the filter, so they run once, with it on), and once per ``caches``
    value (zodb-cache-size; 0: the build's). The hello-world app is no ZEO client: it
    runs only direct (clients 0) with the build's cache, and is left out of a plan without
    them.
    """
    out = []
    for server in servers:
        allowed = [1] if server in single_threaded else list(threads)
        for path in paths:
            filters = sorted(set(sendfile), reverse=True) if path == "blob" else [True]
            counts = [0] if path == "hello" and 0 in clients else [] if path == "hello" else sorted(set(clients))
            sizes = ([0] if 0 in caches else []) if path == "hello" else sorted(set(caches))
            for conns in connections:
                if conns > PATH_MAX_CONNECTIONS.get(path, conns):
                    continue
                if sweep_at is None or conns == sweep_at:
                    values = allowed
                else:
                    values = [default_threads(server, single_threaded)]
                for t in sorted(set(values)):
                    for count in counts:
                        for on in filters:
                            out.extend(Cell(server, t, path, conns, count, on, size) for size in sizes)
    return out


def parts_of(cell):
    """``[Part]`` serving ``cell``: replicas 1..n of its (server, threads, sendfile, cache) for
    n clients behind HAProxy, replica 1 alone for a direct cell."""
    return [Part(cell.server, cell.threads, cell.sendfile, replica, cell.cache)
            for replica in range(1, max(cell.clients, 1) + 1)]


def parts_needed(cell_list):
    """Sorted ``[Part]`` the cells need (:func:`parts_of` each): per (server, threads,
    sendfile, cache) replicas 1..n for the largest client count n of those cells."""
    return sorted({part for c in cell_list for part in parts_of(c)})


def run_order(cell_list, runs, seed):
    """The randomized interleaved order: ``runs`` rounds, each visiting every cell once in
    a new random order (``random.Random(seed)``). Returns ``[(cell, index)]`` of length
    ``len(cell_list) * runs``; run ``index`` of a cell is in round ``index``."""
    rng = random.Random(seed)
    order = []
    for index in range(runs):
        round_cells = list(cell_list)
        rng.shuffle(round_cells)
        order.extend((cell, index) for cell in round_cells)
    return order


def run_key(record):
    """``(Cell, index)`` of a results.jsonl record (dict with server, threads, path,
    connections, run, and clients, sendfile and cache unless written before those axes)."""
    return (cell_of(record), record["run"])


def cell_of(record):
    """The :class:`Cell` of a results.jsonl record or a report row (dict)."""
    return Cell(record["server"], record["threads"], record["path"], record["connections"],
                record.get("clients", 0), record.get("sendfile", True), record.get("cache", 0))


def load_results(path):
    """Records (dicts) of a results.jsonl file; [] when it does not exist.

    A last line cut by an interruption (invalid JSON) is skipped.
    """
    records = []
    try:
        with open(path, encoding="utf-8") as fp:
            for line in fp:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return records


def remaining(order, records):
    """``order`` without the runs already in ``records`` (resume)."""
    done = {run_key(r) for r in records}
    return [item for item in order if item not in done]


def cell_duration(rate, connections, per_connection, minimum, maximum):
    """Seconds of one run (wrk's ``-d``, a whole number): long enough that each of
    ``connections`` completes ``per_connection`` requests on average at ``rate``
    requests/s, at least ``minimum`` and at most ``maximum`` seconds.

    ``rate`` is what the cell served in its warm-up or its previous run (None or 0 when
    unknown or nothing was served: ``maximum``). ``per_connection`` 0 gives ``minimum``
    (fixed-length runs). wrk counts per thread, not per connection, so "each connection"
    is the average: a server that serves some connections and starves others can pass.
    """
    if per_connection <= 0:
        return minimum
    if not rate:
        return maximum
    return max(minimum, min(maximum, math.ceil(per_connection * connections / rate)))


def steady(requests, connections, per_connection):
    """True when ``requests`` completed in a run of ``connections`` connections reach
    ``per_connection`` per connection on average: the run measured the server's steady
    state, not only the first response of each connection (a lower bound of its latency
    and throughput)."""
    return requests >= per_connection * connections


def estimate_seconds(runs, n_parts, duration, warmup, drain_max=20, per_connection=0, max_duration=None):
    """Estimated wall seconds of measuring ``runs`` (``[(cell, index)]``): each run's
    duration (``cell_duration`` at the path's RATE_GUESS, between ``duration`` and
    ``max_duration`` seconds; ``per_connection`` 0: ``duration``) plus RUN_OVERHEAD_S,
    ``warmup`` + CELL_OVERHEAD_S s per distinct cell, and starting ``n_parts`` parts
    (nothing when ``runs`` is empty). At HIGH_CONNECTIONS or more on a Zope path a run
    adds the idle wait for the requests wrk abandoned: HIGH_DRAIN_S, or on ``/Plone``
    connections / SLOW_PAGE_RPS seconds, at most ``drain_max``; a run through HAProxy
    (``clients`` >= 1) adds BALANCER_START_S; a ``logged-in`` run and cell (its warm-up is a
    Locust run too) add LOCUST_OVERHEAD_S each."""
    if not runs:
        return 0.0
    total = STARTUP_BASE_S + n_parts * STARTUP_PER_PART_S
    distinct = {Cell(*cell) for cell, _ in runs}
    total += sum(warmup + CELL_OVERHEAD_S + (LOCUST_OVERHEAD_S if c.path == LOGGED_IN else 0.0) for c in distinct)
    for cell, _ in runs:
        cell = Cell(*cell)
        path, conns = cell.path, cell.connections
        total += BALANCER_START_S if cell.clients else 0.0
        total += LOCUST_OVERHEAD_S if path == LOGGED_IN else 0.0
        total += cell_duration(RATE_GUESS.get(path), conns, per_connection, duration,
                               duration if max_duration is None else max_duration) + RUN_OVERHEAD_S
        if conns >= HIGH_CONNECTIONS and path not in ("hello", LOGGED_IN):
            total += min(conns / SLOW_PAGE_RPS if path == "/Plone" else HIGH_DRAIN_S, drain_max)
    return total


def trimmed_mean(values):
    """Mean of ``values`` without the highest and the lowest (the 2016 AppDynamics method:
    4 runs, mean of the middle two). With fewer than 3 values: their plain mean; None
    values are ignored; None when nothing is left."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    if len(values) >= 3:
        values = values[1:-1]
    return sum(values) / len(values)
