"""What do N concurrent connections through HAProxy get? Errors, requests/s, latency, and
with ``--fairness`` whether every one of them is served.

Usage (stack running, site created; see ``make start``)::

    .venv/bin/python -m loadtests connections [--connections 1000[,10000...]] [--duration 60]
        [--paths /,/Plone,@json,blob] [--timeout S] [--rounds 1] [--warmup S]
        [--baseline N] [--baseline-duration 15] [--url http://127.0.0.1:PORT]
        [--threads 2 | --fairness [--connect-rate 2000]] [--out var/reports]

For each round, path and number in ``--connections``, that many keep-alive connections to
the HAProxy frontend of ``parts/stack/stack.json`` (or ``--url``) send GET requests for
``--duration`` seconds. HAProxy holds them all (its global ``maxconn``) and passes at most
``maxconn`` = threads requests to each ZEO client; the rest wait in its backend queue
(``timeout queue``). Two load generators:

- wrk (Debian's ``wrk``, the default): totals over all connections; ``--threads`` wrk
  threads. Defaults: all four paths, ``--warmup 3`` (seconds at min(10, N) connections
  before each path), ``--timeout 90`` (longer than HAProxy's ``timeout queue``, so a
  starved request shows as HAProxy's 503, not as a wrk timeout), no baseline. Whole
  seconds only (wrk's own units).
- ``--fairness``: the closed-loop client (:mod:`loadtests.connections.closedloop`), which counts
  completions per connection: is every connection served? Connections are opened at
  ``--connect-rate`` per second (a burst of 10,000 SYNs overflows the kernel's accept
  queue and delays some connections by SYN retransmits of 1, 3, 7 ... s, the load
  generator's unfairness, not the server's); a request still open when the run ends counts
  as ``unfinished``, not as an error, so ``--timeout`` must be shorter than the run.
  Defaults: path ``/``, no warm-up, ``--timeout`` 3/4 of ``--duration``, a baseline of
  10 connections for 15 s per path and round. ``python -m loadtests fairness`` is an alias.

``--baseline N`` (either generator) measures N connections for ``--baseline-duration``
seconds first: the reference throughput each run's requests/s is divided by; with
``--rounds`` > 1 every ratio is to a baseline minutes apart under the same foreign load.

Recorded per run: requests, requests/s, latency mean / p50 / p99 / max in seconds (wrk
also p90 and MiB/s), errors by kind (only kinds that occurred; wrk: ``connect``, ``read``,
``write``, ``timeout``; the closed loop: ``connect``, ``timeout``, ``reset``, ``closed``
(no answer before EOF), ``malformed``; both ``non_2xx`` for answers other than 2xx/3xx),
the Little's-law mean (connections / requests/s: what the mean latency must be if every
connection is served in turn) and p99 over it, the ratio to the baseline, HAProxy's 5xx
(its frontends' count, its own 503s included), sessions per server and longest backend
queue (``/stats;csv``; ``qmax`` is since HAProxy started), the seconds the backend took to
drain after the run, the kernel's accept-queue overflows (``ListenOverflows``, whole
machine), and the CPU seconds of the stack (per process), of the load generator (this
process and wrk) and of foreign processes (the machine is shared). ``--fairness`` adds
connections served (at least one completion), min / median / max completions per
connection and ``unfinished``.

Output: a table on stdout and ``<out>/connections-<YYYYmmdd-HHMMSS>/report.json``
(``{"meta": {...}, "runs": [one dict per run]}``) and ``report.md``. Exit status 0 when
every run had no error (and, with ``--fairness``, served every connection), 1 otherwise, 2
when the stack is not ready, wrk is missing, the descriptor limit is too low or an option is
invalid. Traffic goes only to 127.0.0.1.
"""
import sys
from datetime import datetime, timezone
from urllib.parse import urlsplit

import psutil

from loadtests.connections import closedloop
from loadtests.core import haproxy_stats
from loadtests.core.cli import (add_counts_argument, add_run_arguments, add_stack_arguments, exits_2_when_not_ready,
                                new_parser)
from loadtests.core.procs import cpu_seconds, listen_overflows, machine_busy_seconds, own_cpu_seconds, raise_fd_limit
from loadtests.core.reports import finish_report, markdown_table, report_folder
from loadtests.core.stack import PATHS, check_servers_up, frontend_maxconn, load_stack, stack_pids, wait_backend_idle
from loadtests.core.stats import littles_law
from loadtests.core.wrk import require_wrk, run_wrk

#: Defaults that depend on the load generator: {option: (wrk, closed loop)}.
DEFAULTS = {"paths": (",".join(PATHS), "/"), "warmup": (3.0, 0.0), "baseline": (0, 10)}
#: Options of one generator only: {option: (generator, default)}.
ONLY = {"threads": ("wrk", 2), "connect_rate": ("fairness", 2000.0)}


def parse_args(argv, name="connections"):
    parser = new_parser(
        name, "N keep-alive connections per path through HAProxy: errors, requests/s, latency "
        "percentiles and p99 / Little's-law mean, with wrk or (--fairness) the closed-loop client that "
        "counts completions per connection (is every connection served?).")
    add_counts_argument(parser, "--connections", "1000", "comma-separated connection counts, one run each")
    parser.add_argument("--fairness", action="store_true",
                        help="use the closed-loop client and count completions per connection "
                        "(default: wrk, totals only)")
    add_run_arguments(parser, duration=60.0, rounds=1, rounds_help=(
        "repeat baseline + every connection count this many times, alternating, so each ratio "
        "is to a baseline measured minutes apart under the same foreign load"))
    parser.add_argument("--warmup", type=float, default=None,
                        help="uncounted seconds at min(10, N) connections before each path and round "
                        "(default 3 with wrk, 0 with --fairness)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a request may take before it counts as a timeout error (default 90 "
                        "with wrk; with --fairness 3/4 of --duration, and it must be shorter than the run)")
    parser.add_argument("--paths", default=None,
                        help=f"comma-separated: {', '.join(PATHS)} (@json = /Plone as JSON) or URL paths "
                        "starting with / (default: the four with wrk, / with --fairness)")
    parser.add_argument("--baseline", type=int, default=None,
                        help="connections of a reference run per path and round, 0: none (default 0 "
                        "with wrk, 10 with --fairness)")
    parser.add_argument("--baseline-duration", type=float, default=15.0,
                        help="seconds of the reference run (default 15)")
    parser.add_argument("--threads", type=int, default=None, help="wrk threads (wrk only; default 2)")
    parser.add_argument("--connect-rate", type=float, default=None,
                        help="new connections per second at the start of a run (--fairness only; "
                        "default 2000)")
    parser.add_argument("--url", default=None,
                        help="frontend base URL (default: the stack's frontend_url); must be 127.0.0.1")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    generator = "fairness" if args.fairness else "wrk"
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value[args.fairness])
    for name, (only, default) in ONLY.items():
        if getattr(args, name) is None:
            setattr(args, name, default if only == generator else None)
        elif only != generator:
            parser.error(f"--{name.replace('_', '-')} is an option of "
                         f"{'--fairness' if only == 'fairness' else 'wrk (without --fairness)'}")
    if args.timeout is None:
        args.timeout = args.duration * 0.75 if args.fairness else 90.0
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in args.paths if p not in PATHS and not p.startswith("/")]
    if bad or not args.paths:
        parser.error(f"--paths: {', '.join(bad) or 'empty'} not allowed; allowed: {', '.join(PATHS)} or a "
                     "URL path starting with /")
    if args.duration <= 0 or args.timeout <= 0 or args.warmup < 0 or args.baseline < 0 \
            or args.baseline_duration <= 0 or args.rounds < 1:
        parser.error("--duration, --timeout and --baseline-duration must be > 0, --warmup and --baseline "
                     ">= 0, --rounds >= 1")
    if args.fairness:
        if args.timeout >= args.duration:
            parser.error(f"--timeout ({args.timeout:g} s) must be shorter than --duration "
                         f"({args.duration:g} s): a request open at the end counts as unfinished")
        if args.connect_rate <= 0:
            parser.error("--connect-rate must be > 0")
    else:
        for name in ("duration", "timeout", "warmup", "baseline_duration"):
            if getattr(args, name) != int(getattr(args, name)):
                parser.error(f"--{name.replace('_', '-')}: wrk takes whole seconds, got {getattr(args, name)}")
        if args.threads < 1 or min(args.connections) < args.threads:
            parser.error(f"--threads must be >= 1 and every --connections count at least --threads "
                         f"({args.threads})")
    return args


def wrk_generator(wrk, threads):
    """A load generator (see :func:`measure`) that runs wrk once: the row has requests, rps,
    mib_per_s, latency_s {mean, p50, p90, p99, max} and errors {kind: count}."""
    def generate(url, accept, connections, duration, timeout, progress):
        summary = run_wrk(url, connections, int(duration), threads=threads, timeout=int(timeout),
                          accept=accept, wrk=wrk, progress=progress)
        seconds = summary["duration_us"] / 1e6
        errors = {"non_2xx" if kind == "status" else kind: n for kind, n in summary["errors"].items() if n}
        return {
            "connections": connections,
            "duration_s": round(seconds, 1),
            "requests": summary["requests"],
            "rps": round(summary["requests"] / seconds, 1) if seconds else 0.0,
            "mib_per_s": round(summary["bytes"] / seconds / 2**20, 1) if seconds else 0.0,
            "latency_s": {k: round(summary["latency_us"][k] / 1e6, 3) for k in ("mean", "p50", "p90", "p99", "max")},
            "errors": dict(sorted(errors.items())),
        }
    return generate


def closed_loop_generator(connect_rate):
    """A load generator (see :func:`measure`) that runs :func:`loadtests.connections.closedloop.run`."""
    def generate(url, accept, connections, duration, timeout, progress):
        return closedloop.run(url, accept, connections, duration, timeout, connect_rate, progress)
    return generate


def measure(config, generate, url, accept, connections, duration, timeout, label=""):
    """One run through the stack's HAProxy with its counters and the CPU seconds around it.

    ``generate(url, accept, connections, duration, timeout, progress)`` runs the load and
    returns the run's row (requests, rps, latency_s, errors, ...); ``progress(elapsed s)``
    prints HAProxy's view every 5 s. Returns that row plus ``timeout_s``, Little's law
    (:func:`loadtests.core.stats.littles_law`), ``haproxy`` {sessions, hrsp_5xx, backend_qmax,
    per_server_sessions, drain_after_run_s}, ``listen_overflows`` and ``cpu_s`` {stack:
    {process: s}, client, foreign, foreign_percent}. Raises RuntimeError when the backend
    does not drain (:func:`loadtests.core.stack.wait_backend_idle`) or wrk fails.
    """
    wait_backend_idle(config)
    procs = stack_pids(config)
    before = haproxy_stats.fetch(config["stats_url"])
    cpu_before, busy_before, own_before = cpu_seconds(procs), machine_busy_seconds(), own_cpu_seconds()
    overflows_before = listen_overflows()

    def progress(elapsed):
        try:
            rows = haproxy_stats.fetch(config["stats_url"])
        except OSError as exc:
            print(f"  {label}: {elapsed:4.0f}/{duration:g} s, HAProxy stats not answering: {exc}", flush=True)
            return
        done = sum(d["stot"] for d in haproxy_stats.deltas(before, rows, config["backend"]).values())
        queued = haproxy_stats.backend_row(rows, config["backend"])["qcur"]
        print(f"  {label}: {elapsed:4.0f}/{duration:g} s, {done} requests served, {queued} queued in HAProxy",
              flush=True)

    row = generate(url, accept, connections, duration, timeout, progress)
    own = own_cpu_seconds() - own_before
    stack_cpu = {n: v - cpu_before.get(n, 0.0) for n, v in cpu_seconds(procs).items()}
    busy = machine_busy_seconds() - busy_before
    after = haproxy_stats.fetch(config["stats_url"])
    overflows = listen_overflows() - overflows_before
    drained = wait_backend_idle(config)  # requests still queued when the load stopped: dropped (abortonclose)
    servers = haproxy_stats.deltas(before, after, config["backend"])
    foreign = max(busy - sum(stack_cpu.values()) - own, 0.0)
    row.update({
        "timeout_s": timeout,
        **littles_law(connections, row["rps"], row["latency_s"]["p99"]),
        "haproxy": {
            "sessions": sum(d["stot"] for d in servers.values()),
            "hrsp_5xx": haproxy_stats.frontend_5xx(after) - haproxy_stats.frontend_5xx(before),
            "backend_qmax": int(haproxy_stats.backend_row(after, config["backend"])["qmax"] or 0),
            "per_server_sessions": {n: d["stot"] for n, d in servers.items()},
            "drain_after_run_s": round(drained, 1),
        },
        "listen_overflows": overflows,
        "cpu_s": {"stack": {n: round(v, 1) for n, v in stack_cpu.items()}, "client": round(own, 1),
                  "foreign": round(foreign, 1),
                  "foreign_percent": round(100 * foreign / (duration * (psutil.cpu_count() or 1)), 1)},
    })
    return row


def _cell_errors(row):
    return ", ".join(f"{k} {v}" for k, v in row["errors"].items()) or "0"


#: The report's columns: (header, cell of a row, shown with wrk, shown with --fairness).
COLUMNS = [
    ("round", lambda r: r["round"], True, True),
    ("path", lambda r: r["path"], True, True),
    ("connections", lambda r: r["connections"], True, True),
    ("served", lambda r: r.get("served"), False, True),
    ("completions min/median/max",
     lambda r: f"{r['completions_min']}/{r['completions_median']}/{r['completions_max']}", False, True),
    ("requests", lambda r: r["requests"], True, False),
    ("req/s", lambda r: r["rps"], True, True),
    ("MiB/s", lambda r: r.get("mib_per_s"), True, False),
    ("baseline req/s", lambda r: r.get("baseline_rps"), True, True),
    ("ratio", lambda r: r.get("ratio_to_baseline"), True, True),
    ("mean s", lambda r: r["latency_s"]["mean"], True, True),
    ("p50 s", lambda r: r["latency_s"]["p50"], True, True),
    ("p90 s", lambda r: r["latency_s"].get("p90"), True, False),
    ("p99 s", lambda r: r["latency_s"]["p99"], True, True),
    ("max s", lambda r: r["latency_s"]["max"], True, True),
    ("Little's mean s", lambda r: r["littles_law_mean_s"], True, True),
    ("p99 / Little", lambda r: r["p99_over_littles_mean"], True, True),
    ("errors", _cell_errors, True, True),
    ("unfinished", lambda r: r.get("unfinished"), False, True),
    ("HAProxy 5xx", lambda r: r["haproxy"]["hrsp_5xx"], True, True),
    ("queue max", lambda r: r["haproxy"]["backend_qmax"], True, True),
    ("accept-queue overflows", lambda r: r["listen_overflows"], True, True),
    ("foreign CPU %", lambda r: r["cpu_s"]["foreign_percent"], True, True),
]


def to_markdown(rows, meta):
    """The rows (one per round, path and connection count) as a Markdown table with a header
    paragraph; the columns of ``meta["client"]`` ("wrk" or "closed loop")."""
    fairness = meta["client"] == "closed loop"
    columns = [(header, cell) for header, cell, wrk, closed in COLUMNS if (closed if fairness else wrk)]
    client = (f"closed-loop client, connects {meta['connect_rate_per_s']:g}/s" if fairness
              else f"wrk, {meta['threads']} threads")
    lines = [
        f"# {'Fairness: ' if fairness else ''}N connections through HAProxy, {meta['duration_s']:g} s per run",
        "",
        f"{meta['started']}; {client}; HAProxy frontend maxconn {meta['haproxy_maxconn']}, balance "
        f"{meta['balance']}; timeout {meta['timeout_s']:g} s; fd limit {meta['fd_limit']}; somaxconn "
        f"{meta['somaxconn']}.",
        "",
        markdown_table([h for h, _ in columns], [[cell(r) for _, cell in columns] for r in rows]),
    ]
    notes = [f"- round {r['round']}, {r['path']}, {r['connections']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def somaxconn():
    """net.core.somaxconn (int): the longest accept queue a listener can have; 0 if unreadable."""
    try:
        with open("/proc/sys/net/core/somaxconn", encoding="ascii") as fp:
            return int(fp.read())
    except (OSError, ValueError):
        return 0


def clean(row):
    """True when a run had no error and, where counted, served every connection."""
    return not row["errors"] and row.get("served", row["connections"]) == row["connections"]


@exits_2_when_not_ready("connections")
def main(argv=None, name="connections"):
    """Entry point (module docstring); ``name``: the subcommand as called (the alias passes "fairness")."""
    args = parse_args(argv, name)
    generate = closed_loop_generator(args.connect_rate) if args.fairness else wrk_generator(require_wrk(),
                                                                                            args.threads)
    config = load_stack(args.stack_config)
    check_servers_up(config)  # a server down would show as its share of errors, not as the queue's
    base = (args.url or config["frontend_url"]).rstrip("/")
    if urlsplit(base).hostname != "127.0.0.1":
        print(f"--url must point at 127.0.0.1, got {base}", file=sys.stderr)
        return 2
    most = max(args.connections + [args.baseline])
    fd_limit = raise_fd_limit(most + 64)
    if fd_limit[0] < most + 16:
        print(f"fd limit {fd_limit} too low for {most} connections", file=sys.stderr)
        return 2
    maxconn = frontend_maxconn(config) if not args.url else None
    if maxconn and most > maxconn:
        print(f"note: {most} connections > HAProxy maxconn {maxconn}: the rest wait in the kernel's "
              "accept backlog", flush=True)
    per_path = args.warmup + (args.baseline_duration if args.baseline else 0) + args.duration * len(args.connections)
    print(f"{len(args.paths)} path(s) x {args.rounds} round(s), {per_path:g} s each: about "
          f"{per_path * len(args.paths) * args.rounds:g} s", flush=True)
    started = datetime.now(timezone.utc)
    rows = []
    for round_ in range(1, args.rounds + 1):
        for label in args.paths:
            path, accept = PATHS.get(label, (label, ""))
            url = base + path
            try:
                if args.warmup:
                    measure(config, generate, url, accept, min(10, *args.connections), args.warmup,
                            min(args.timeout, args.warmup * 0.75) if args.fairness else args.timeout, label)
                baseline = None
                if args.baseline:
                    b = measure(config, generate, url, accept, args.baseline, args.baseline_duration,
                                min(args.timeout, args.baseline_duration * 0.75) if args.fairness
                                else args.timeout, label)
                    baseline = b["rps"]
                    b.update(path=label, round=round_, baseline_rps=baseline, ratio_to_baseline=1.0)
                    rows.append(b)
                    print(f"{label}: baseline {args.baseline} connections: {baseline} req/s", flush=True)
                for n in args.connections:
                    print(f"[round {round_}/{args.rounds}] {label}: {n} connections for {args.duration:g} s ...",
                          flush=True)
                    r = measure(config, generate, url, accept, n, args.duration, args.timeout, label)
                    r.update(path=label, round=round_, baseline_rps=baseline,
                             ratio_to_baseline=round(r["rps"] / baseline, 2) if baseline else None)
                    if r["rps"] and n / r["rps"] > args.duration:
                        r["note"] = (f"connections / req/s = {n / r['rps']:.0f} s > run length: not every "
                                     "connection can be served in this run")
                    rows.append(r)
                    served = f"served {r['served']}/{n}, " if "served" in r else ""
                    print(f"  {served}{r['requests']:,} requests, {r['rps']} req/s, errors {_cell_errors(r)}, "
                          f"p99 {r['latency_s']['p99']} s, p99/Little {r['p99_over_littles_mean']}", flush=True)
            except RuntimeError as exc:
                print(str(exc), file=sys.stderr)
                return 1
    meta = {
        "started": started.isoformat(timespec="seconds"),
        "client": "closed loop" if args.fairness else "wrk",
        "duration_s": args.duration,
        "timeout_s": args.timeout,
        "warmup_s": args.warmup,
        "rounds": args.rounds,
        "threads": args.threads,
        "connect_rate_per_s": args.connect_rate,
        "haproxy_maxconn": maxconn,
        "balance": config.get("balance"),
        "servers": config.get("server_kinds"),
        "fd_limit": list(fd_limit),
        "somaxconn": somaxconn(),
        "cores": psutil.cpu_count(),
        "url": base,
    }
    problems = [f"round {r['round']}, {r['path']}, {r['connections']} connections: errors {_cell_errors(r)}"
                + (f", served {r['served']}" if "served" in r else "") for r in rows if not clean(r)]
    return finish_report(report_folder(args.out, "connections", started), {"meta": meta, "runs": rows},
                         to_markdown(rows, meta), problems=problems)


if __name__ == "__main__":
    sys.exit(main())
