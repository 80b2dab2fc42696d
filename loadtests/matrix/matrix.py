"""Benchmark matrix: WSGI servers x paths x connections x threads (x ZEO clients behind
HAProxy x blob-sendfile), each cell measured 3 times.

Usage (stack running with the site: ``make start``; Debian's ``wrk`` on PATH)::

    .venv/bin/python -m loadtests matrix [--quick] [--servers pyruvate,waitress,...]
        [--paths /,/Plone,@json,blob,hello[,logged-in]] [--connections 1,10,100,1000]
        [--threads 1,2,4] [--sweep-at 100] [--clients 0] [--sendfile on] [--zodb-cache-sizes 30000]
        [--runs 3] [--duration 1] [--max-duration 20]
        [--requests-per-connection 3] [--warmup 1] [--drain-max 20]
        [--out var/reports] [--resume DIR] [--estimate]

Three subcommands are this matrix with other defaults (:data:`PRESETS`; any option above
still overrides them): ``servers-wrk`` (every server on ``/`` at 10 connections),
``scaling`` (pyruvate on ``/Plone`` through HAProxy over 1-4 ZEO clients at 1, 2 and 4
threads) and ``blob`` (pyruvate and waitress on the blob at 1-8 connections, with
``blob-sendfile`` on and off, direct and through HAProxy).

The path class ``logged-in`` (opt-in: not in the default ``--paths``) is no wrk path: each of
its runs is one Locust process of the locustfile's logged-in shape (loadtests/loggedin.py,
:func:`loadtests.matrix.matrix_measure.measure_logged_in`), ``--connections`` editors who log
in during 3 uncounted seconds and then each, in a closed loop, view the front page as a
Member, list the folder contents, open the edit form of a document of their own and save it,
every answer checked (a failed check counts in ``non_2xx``); its req/s counts those four
requests together. It runs only at connection counts up to 40 (the documents: more editors
would save the same ones at once). It needs the site's editors, which only
``PLONEDEPLOY_EDITORS=on make site`` creates (scripts/create_site.py): the matrix refuses the
path (exit 2, naming ``--paths logged-in`` and that command) without their password
(``$PLONEDEPLOY_EDITOR_PASSWORD`` or ``var/editor-password``) and, before it builds anything,
when ``editor1`` cannot log in through the stack's frontend (the matrix's clients are ZEO
clients of the same database, so they have the same users).

The three extra axes: ``--clients`` 0 is wrk against one ZEO client directly; n >= 1 is wrk
against a temporary HAProxy (the stack's own template, loadtests/core/balancers.py: leastconn,
maxconn = threads) over n ZEO clients of the same server and threads, started for each run
(its CPU and RSS count as the server's, with the clients'; ``share`` in the run's record is
each client's part of HAProxy's sessions). ``--sendfile off`` adds ZEO clients built with
``blob-sendfile = off``, measured on the blob only (no other path reaches the filter).
``--zodb-cache-sizes`` adds ZEO clients built with another ``zodb-cache-size`` (objects per
ZODB connection; the build's is 30000, :data:`loadtests.matrix.serverbuild.ZODB_CACHE_SIZE`),
measured on every Zope path; the report compares each with the build's per round.

What it does (method of the 2016 AppDynamics benchmark, improved):

1. plans the cells: every server x path x connection level at the server's default
   threads (2; 1 for the single-threaded bjoern and gevent), plus every ``--threads``
   value at ``--sweep-at`` connections; prints cells, runs and the estimated wall time;
2. builds ``--build`` (default var/matrix/): one ZEO client part per (server, threads,
   blob-sendfile, replica), ZEO clients of the stack's zeoserver, each default-built one
   with a hello-world server next to it (same server runner and settings, no Zope;
   loadtests/matrix/matrix_servers.py), on ports from ``--base-port`` (9510..9599; a balanced
   cell's HAProxy takes the two after the parts'); starts them all at once and waits
   until each answers (and the blob's download is 5 MiB);
3. measures every cell ``--runs`` times in randomized interleaved order (rounds that
   each visit every cell once in a new random order), each cell warmed up once (wrk,
   ``--warmup`` s, at most 10 connections: a warm-up at 1,000 would leave up to 1,000
   abandoned requests to work off) before its first run; before every run it waits until
   the server is idle (at most ``--drain-max`` s); a run is wrk with ``--connections``
   held long enough that each connection completes ``--requests-per-connection``
   requests (3) on average at the rate the cell served in its warm-up or its last run,
   between ``--duration`` (1) and ``--max-duration`` (20) seconds
   (loadtests/matrix/matrix_measure.py). A cell with a run that falls short is marked not
   steady (``U``): mostly first responses, so its figures are bounds. ``--quick`` keeps
   1 s runs and marks its cells the same way;
4. appends every run as one JSON line to ``<dir>/results.jsonl`` as soon as it is
   measured, so an interrupted matrix keeps what it measured and ``--resume <dir>``
   measures only the rest (with the options stored in ``<dir>/options.json``);
5. stops every server it started (by process group; also on Ctrl-C or an error) and
   writes ``matrix.csv``, ``matrix.json``, ``matrix-<path>.png`` (and
   ``matrix-clients.png`` with several client counts) and ``report.md``
   (loadtests/matrix/matrix_report.py) into ``<dir>`` (default
   ``var/reports/<subcommand>-<YYYYmmdd-HHMMSS>/``).

Units: durations in seconds, latencies in milliseconds, throughput in requests/s, CPU in
seconds (per request: milliseconds), RSS in MiB; foreign CPU in % of all cores.

Exit status: 0 when every planned run is measured, 1 when runs failed or were
interrupted (the report covers what was measured), 2 when the stack is not running or is a
RelStorage build (no ZEO server for the parts; core.running_zeo_server), wrk is missing, an
option is invalid or the servers could not be built or started. Traffic goes only to 127.0.0.1.

The parts are in loadtests.matrix.matrix: ``matrix_plan`` (cells, parts, order, steady-state
lengths), ``run`` (the loop over the runs), ``matrix_measure`` (one run), ``matrix_servers``
and ``serverbuild`` (the clients measured), ``matrix_report``, ``matrix_summary`` and
``matrix_rows`` (the report). This module holds the options, the presets and ``main``.
"""
import json
import os
import random
import sys
import time
from datetime import datetime, timezone

import psutil

from loadtests.core.cli import (add_counts_argument, add_run_arguments, add_stack_arguments, exits_2_when_not_ready,
                                name_list, new_parser, parse_counts)
from loadtests.core.locustrun import editors_refused
from loadtests.core.procs import raise_fd_limit
from loadtests.core.stack import ROOT, editor_password_missing, load_stack, running_zeo_server, stack_pids
from loadtests.core.wrk import require_wrk
from loadtests.loggedin import LOGGED_IN
from loadtests.matrix import matrix_plan, matrix_report, matrix_servers
from loadtests.matrix.matrix_measure import ALL_PATHS, MATRIX_PATHS
from loadtests.matrix.run import measure_all
from loadtests.matrix.serverbuild import ZODB_CACHE_SIZE
from plonedeploy.stack.rules import SERVERS, SINGLE_THREADED


# --duration and --warmup (1 s each) are the same with and without --quick: their parser defaults.
DEFAULTS = {"servers": list(SERVERS), "paths": list(MATRIX_PATHS), "connections": [1, 10, 100, 1000],
            "threads": [1, 2, 4], "sweep_at": 100, "runs": 3, "max_duration": 20, "clients": [0],
            "sendfile": ["on"], "zodb_cache_sizes": [ZODB_CACHE_SIZE]}
# --quick keeps 1 s runs (CI time): its cells say whether they reached the steady state.
QUICK = {"servers": ["pyruvate", "waitress"], "paths": list(MATRIX_PATHS), "connections": [1, 50],
         "threads": [2], "sweep_at": None, "runs": 4, "max_duration": 1, "clients": [0], "sendfile": ["on"],
         "zodb_cache_sizes": [ZODB_CACHE_SIZE]}
#: Subcommands that are the matrix with other defaults: ``{name: (options, one line for
#: --help)}``; the command line overrides any of them. They replace the separate tools
#: servers_wrk, scaling and blobbench (removed; docs/reference/loadtests.md).
PRESETS = {
    "servers-wrk": ({"paths": ["/"], "connections": [10], "threads": [2], "sweep_at": "all", "duration": 5},
                    "every WSGI server on / at 10 connections, 2 threads (bjoern, gevent 1): the matrix"),
    "scaling": ({"servers": ["pyruvate"], "paths": ["/Plone"], "connections": [32], "threads": [1, 2, 4],
                 "sweep_at": "all", "clients": [1, 2, 3, 4], "duration": 5},
                "pyruvate on /Plone through HAProxy over 1-4 ZEO clients x threads 1, 2, 4: the matrix"),
    "blob": ({"servers": ["pyruvate", "waitress"], "paths": ["blob"], "connections": [1, 2, 4, 8], "threads": [2],
              "sweep_at": "all", "clients": [0, 1], "sendfile": ["on", "off"], "duration": 5},
             "the 5 MiB blob, blob-sendfile on/off, direct and through HAProxy: the matrix"),
}
PLAN_KEYS = ("servers", "paths", "connections", "threads", "sweep_at", "runs", "duration", "max_duration",
             "requests_per_connection", "warmup", "timeout", "seed", "noisy_pct", "drain_max", "clients",
             "sendfile", "zodb_cache_sizes")
#: What a matrix stored before steady-state runs (options.json without these keys) ran with.
OLD_PLAN = {"max_duration": None, "requests_per_connection": 0, "clients": [0], "sendfile": ["on"],
            "zodb_cache_sizes": [ZODB_CACHE_SIZE]}


#: The matrix's numeric run settings: ``(option, type, default, help)``; a None default is
#: filled from DEFAULTS, QUICK or the preset.
RUN_OPTIONS = (
    ("--max-duration", int, None, "seconds per run at most (default 20; --quick 1): a run lasts long enough for "
     "--requests-per-connection at the rate the cell served in its warm-up or last run"),
    ("--requests-per-connection", int, 3, "requests each connection should complete per run on average (default "
     "3): sizes the runs and marks cells that fall short as not steady (0: fixed --duration runs)"),
    ("--timeout", int, 5, "seconds wrk waits for a response before counting a timeout error (default 5)"),
    ("--drain-max", int, 20, "seconds to wait at most before a run for the server to work off the requests wrk "
     "abandoned (default 20; a run that starts after the full wait is marked backlog)"),
    ("--seed", int, None, "random seed of the run order (default: random, stored)"),
    ("--noisy-pct", float, 25.0, "a cell is noisy when foreign CPU exceeds this %% of all cores (default 25)"),
)


def parse_args(argv, preset=None):
    """Options (argparse.Namespace); ``preset``: a name of PRESETS whose options become the
    defaults; plan options still None are filled from DEFAULTS or QUICK (``--quick``).
    Exits with status 2 and a message naming the option on bad values."""
    description = PRESETS[preset][1] if preset else __doc__.split("\n\n")[0]
    parser = new_parser(preset or "matrix", description, epilog="See docs/how-to/benchmarks.md#benchmark-matrix "
                        "and docs/reference/servers.md.")
    parser.add_argument("--quick", action="store_true",
                        help="CI mode: pyruvate and waitress, connections 1,50, threads 2, 1 s runs")
    parser.add_argument("--servers", type=name_list(parser, "--servers", SERVERS),
                        help=f"comma-separated wsgi-server values from {', '.join(SERVERS)} (default: all)")
    parser.add_argument("--paths", type=name_list(parser, "--paths", ALL_PATHS),
                        help=f"comma-separated path labels from {', '.join(ALL_PATHS)} (default: all but "
                        f"{LOGGED_IN}, the editors of Locust's logged-in shape, which needs PLONEDEPLOY_EDITORS=on "
                        "make site and runs at up to 40 connections)")
    add_counts_argument(parser, "--connections", None, "comma-separated wrk connection counts (default 1,10,100,1000)")
    add_counts_argument(parser, "--threads", None, "comma-separated threads values swept at --sweep-at connections "
                        "(default 1,2,4; single-threaded servers only 1)")
    parser.add_argument("--sweep-at", help="connection count at which --threads are swept (default 100; "
                        "'all': at every connection count)")
    parser.add_argument("--clients", type=lambda text: parse_counts(parser, "--clients", text, minimum=0),
                        help="comma-separated ZEO client counts: 0 direct to one client, n >= 1 through a "
                        "temporary HAProxy over n clients of the same server (default 0)")
    parser.add_argument("--sendfile", type=name_list(parser, "--sendfile", ["on", "off"]),
                        help="comma-separated blob-sendfile values of the clients, on and/or off; off is measured "
                        "on the blob only (default on)")
    parser.add_argument("--zodb-cache-sizes", type=lambda text: parse_counts(parser, "--zodb-cache-sizes", text),
                        help=f"comma-separated zodb-cache-size values (objects per ZODB connection) of the ZEO "
                        f"clients, each a build of its own (default {ZODB_CACHE_SIZE}, the build's)")
    parser.add_argument("--runs", type=int, help="runs per cell (default 3: their median; 4: mean of the middle "
                        "two; --quick 4)")
    add_run_arguments(parser, duration=1, warmup=1, duration_help="seconds per run at least",
                      warmup_help="seconds of warm-up per cell, 0: none")
    for option, kind, default, text in RUN_OPTIONS:
        parser.add_argument(option, type=kind, default=default, help=text)
    parser.add_argument("--resume", metavar="DIR",
                        help="continue the matrix in DIR (its options.json; runs in results.jsonl are skipped)")
    parser.add_argument("--build", default=os.path.join(ROOT, "var", "matrix"),
                        help="directory of the servers' buildout (default var/matrix)")
    parser.add_argument("--base-port", type=int, default=9510,
                        help="first port of the servers (two per part: Zope, hello; default 9510)")
    parser.add_argument("--port-limit", type=int, default=matrix_servers.PORT_RANGE[1],
                        help="last port the servers may use (default 9599)")
    add_stack_arguments(parser)
    parser.add_argument("--estimate", action="store_true", help="print the plan and its estimate, run nothing")
    if preset:
        parser.set_defaults(**PRESETS[preset][0])
    args = parser.parse_args(argv)
    args.subcommand = preset or "matrix"
    if args.resume:
        try:
            stored = json.load(open(os.path.join(args.resume, "options.json"), encoding="utf-8"))
        except (OSError, ValueError) as exc:
            parser.error(f"--resume {args.resume}: no readable options.json ({exc})")
        for key in PLAN_KEYS:
            setattr(args, key, stored[key] if key in stored else OLD_PLAN[key])
        args.subcommand = stored.get("subcommand", args.subcommand)
        if args.max_duration is None:
            args.max_duration = args.duration
        _check_logged_in(parser, args)
        return args
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if isinstance(args.sweep_at, str):
        if args.sweep_at == "all":
            args.sweep_at = None
        elif not args.sweep_at.isdigit() or int(args.sweep_at) < 1:
            parser.error(f"--sweep-at: {args.sweep_at!r} not allowed; allowed: a connection count or 'all'")
        else:
            args.sweep_at = int(args.sweep_at)
    for name in ("runs", "duration", "max_duration"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_duration < args.duration:
        parser.error(f"--max-duration {args.max_duration} is below --duration {args.duration}")
    if args.requests_per_connection < 0:
        parser.error(f"--requests-per-connection must be 0 or more, got {args.requests_per_connection}")
    if args.warmup < 0 or args.timeout < 1 or args.drain_max < 1:
        parser.error("--warmup must be >= 0, --timeout and --drain-max >= 1")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(10**6)
    _check_logged_in(parser, args)
    return args


def _check_logged_in(parser, args):
    """Exit 2 (``parser.error``) when ``--paths`` has ``logged-in`` but the editors' password
    is missing, or none of ``--connections`` is within its PATH_MAX_CONNECTIONS."""
    if not args.paths or LOGGED_IN not in args.paths:
        return
    if missing := editor_password_missing():
        parser.error(f"--paths {LOGGED_IN}: {missing}")
    most = matrix_plan.PATH_MAX_CONNECTIONS[LOGGED_IN]
    if args.connections and min(args.connections) > most:
        parser.error(f"--paths {LOGGED_IN} runs at up to {most} connections (editors with a document each), and "
                     f"--connections {','.join(map(str, args.connections))} has none of them")


def plan(args):
    """``(cells, pairs, order)`` of the options: the cells, the (server, threads) parts and
    the randomized run order (see loadtests/matrix/matrix_plan.py)."""
    cells = matrix_plan.cells(args.servers, args.paths, args.connections, args.threads, args.sweep_at,
                              SINGLE_THREADED, args.clients, [value == "on" for value in args.sendfile],
                              [0 if size == ZODB_CACHE_SIZE else size for size in args.zodb_cache_sizes])
    return cells, matrix_plan.parts_needed(cells), matrix_plan.run_order(cells, args.runs, args.seed)


def _minutes(seconds):
    return f"{seconds / 60:.1f} min"


def _run_length(args):
    if args.max_duration == args.duration or not args.requests_per_connection:
        return f"{args.duration} s"
    return (f"{args.duration}-{args.max_duration} s (long enough for {args.requests_per_connection} "
            "requests per connection)")


@exits_2_when_not_ready("matrix")
def main(argv=None, preset=None):
    """Run the matrix (``preset``: one of PRESETS, as ``python -m loadtests <preset>`` does);
    returns the exit status of the module docstring."""
    args = parse_args(argv, preset)
    cells, pairs, order = plan(args)
    out = args.resume or os.path.join(args.out, f"{args.subcommand}-"
                                      + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"))
    results_path = os.path.join(out, "results.jsonl")
    records = matrix_plan.load_results(results_path)
    todo = matrix_plan.remaining(order, records)
    estimate = matrix_plan.estimate_seconds(todo, len(pairs), args.duration, args.warmup, args.drain_max,
                                            args.requests_per_connection, args.max_duration)
    if args.sweep_at is None:
        sweep = "at every connection level"
    elif args.sweep_at in args.connections:
        sweep = f"at {args.sweep_at} connections, else the default 2 (bjoern, gevent: 1)"
    else:
        sweep = f"not swept: --sweep-at {args.sweep_at} is not among --connections; default 2 (bjoern, gevent: 1)"
    capped = sorted({c for c in args.connections for p in args.paths
                     if c > matrix_plan.PATH_MAX_CONNECTIONS.get(p, c)})
    axes = "" if args.clients == [0] and args.sendfile == ["on"] else (
        f", clients {','.join(map(str, args.clients))} (0: direct), blob-sendfile {','.join(args.sendfile)}")
    if args.zodb_cache_sizes != [ZODB_CACHE_SIZE]:
        axes += f", zodb-cache-size {','.join(map(str, args.zodb_cache_sizes))}"
    print(f"{args.subcommand}: {len(args.servers)} servers, {len(args.paths)} paths, connections "
          f"{','.join(map(str, args.connections))}, threads {','.join(map(str, args.threads))} "
          f"({sweep}){axes}"
          + (f" ({LOGGED_IN} not at {','.join(map(str, capped))})" if capped else "")
          + f": {len(cells)} cells x {args.runs} runs = {len(order)} runs "
          f"of {_run_length(args)} (+{args.warmup} s warm-up per cell), {len(pairs)} parts; "
          f"{len(order) - len(todo)} runs already measured; estimate {_minutes(estimate)}", flush=True)
    if args.estimate:
        return 0
    wrk = require_wrk()
    config = load_stack(args.stack_config)
    zeo = running_zeo_server(config)
    if todo and LOGGED_IN in args.paths:
        # Before anything is built: the matrix's clients share the stack's database and users.
        url = config["frontend_url"].rstrip("/")
        if refused := editors_refused(url):
            print(f"matrix: --paths {LOGGED_IN}: {refused}", file=sys.stderr)
            return 2
    stack = stack_pids(config)
    ports = matrix_servers.assign_ports(pairs, args.base_port)
    last_port = max(p for pair in ports.values() for p in pair)
    balancer_port = last_port + 1 if any(cell.clients for cell in cells) else None
    last_port += 2 if balancer_port else 0
    if args.base_port < 1 or last_port > args.port_limit:
        print(f"matrix: {len(pairs)} parts need ports {args.base_port}-{last_port}, beyond --port-limit "
              f"{args.port_limit}", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "options.json"), "w", encoding="utf-8") as fp:
        json.dump({"subcommand": args.subcommand, **{key: getattr(args, key) for key in PLAN_KEYS}}, fp, indent=1)
    meta = {"subcommand": args.subcommand, "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "cores": psutil.cpu_count(),
            "cells_planned": len(cells), "runs_planned": len(order), "estimate_s": round(estimate),
            **{(f"{k}_s" if k in ("duration", "max_duration", "warmup", "timeout", "drain_max") else k):
               getattr(args, k) for k in PLAN_KEYS}}
    status = 0
    t0 = time.monotonic()
    if todo:
        status = measure_all(args, config, stack, pairs, ports, todo, wrk, results_path, zeo, balancer_port)
    records = matrix_plan.load_results(results_path)
    meta.update(runs_done=len(records), cells_done=len({matrix_plan.run_key(r)[0] for r in records}),
                fd_limit=list(raise_fd_limit(0)), wall_s=round(time.monotonic() - t0))
    matrix_report.write_all(records, meta, out, SINGLE_THREADED)
    print(f"matrix: {len(records)} of {len(order)} runs measured in {_minutes(meta['wall_s'])} "
          f"(estimate {_minutes(estimate)}); report {os.path.join(out, 'report.md')}")
    if status == 0 and len(matrix_plan.remaining(order, records)) > 0:
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
