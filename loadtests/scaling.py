"""Scaling across ZEO clients on one host: /Plone throughput with 1..N clients x threads.

Usage (stack running with the site, ``make start``; ``wrk`` on PATH)::

    .venv/bin/python -m loadtests.scaling [--clients 1,2,3,4] [--threads 1,2,4]
        [--duration 20] [--connections 32] [--rounds 1] [--path /Plone]
        [--build var/scaling] [--port 8300] [--out var/reports]

Builds ``--build`` (a buildout with one pyruvate ZEO client part ``s<threads>_<i>`` per
threads value and client number, all ZEO clients of the stack's zeoserver, ports
``--port`` + 10 x (index of the threads value) + i) unless built. Then, per threads value:
starts clients 1..max one after another, and for each client count n (rounds alternate
the order: 1..N, then N..1) renders the recipe's templates/haproxy.cfg.j2 with the stack's variables for clients
1..n (leastconn, maxconn = threads) into a temporary HAProxy on ``--port`` + 90/91,
warms up for 3 s, and runs wrk with ``--connections`` keep-alive connections on
``--path`` for ``--duration`` seconds. The clients are stopped after their threads value.

Per cell (threads, clients): requests/s (mean over rounds), the ratio to one client at
the same threads, p50/p99 latency (seconds), socket errors and non-2xx, each server's
share of HAProxy's sessions, and the CPU load of foreign processes. Output: a table on
stdout and ``<out>/scaling-<YYYYmmdd-HHMMSS>/`` with ``report.json``, ``report.md`` and
``scaling.png`` (req/s against clients, one line per threads value).

Exit status 0, 1 if a cell had socket errors or non-2xx answers, 2 when the stack is not
running or is a RelStorage build (no ZEO server for the clients; core.running_zeo_server),
wrk is missing, an option is invalid or a client does not start.
Traffic goes only to 127.0.0.1.
"""
import os
import sys
from datetime import datetime, timezone

import psutil

from loadtests import extrabuild, haproxy_stats, serverbuild
from loadtests.balancers import BalancerError, TemporaryBalancer
from loadtests.core import (add_counts_argument, add_run_arguments, add_stack_arguments, cpu_seconds,
                            exits_2_when_not_ready, fetch_stats, load_stack, machine_busy_seconds,
                            markdown_table, new_figure, new_parser, report_folder, require_wrk, run_wrk,
                            running_zeo_server, save_figure, stack_pids, write_report, zeo_server)
from plonedeploy.recipe.stack import StackError

ROOT = serverbuild.ROOT
BACKEND = "zeoclients"

def parse_args(argv):
    parser = new_parser("scaling", __doc__.split("\n")[0])
    add_counts_argument(parser, "--clients", "1,2,3,4", "client counts to measure")
    add_counts_argument(parser, "--threads", "1,2,4", "threads per client; pool-size follows")
    add_run_arguments(parser, duration=20, rounds=1)
    parser.add_argument("--connections", type=int, default=32,
                        help="wrk connections, the same for every cell (default 32)")
    parser.add_argument("--path", default="/Plone", help="path to request (default /Plone)")
    parser.add_argument("--build", default=os.path.join(ROOT, "var", "scaling"),
                        help="buildout directory for the clients (default var/scaling)")
    parser.add_argument("--port", type=int, default=8300,
                        help="first port (default 8300: clients 8301.., balancer 8390/8391)")
    add_stack_arguments(parser, stack_config=False)
    args = parser.parse_args(argv)
    args.clients, args.threads = sorted(set(args.clients)), sorted(set(args.threads))
    for name in ("duration", "connections", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer")
    if len(args.threads) > 9 or max(args.clients) > 9:
        parser.error("at most 9 threads values and 9 clients (10 ports per threads value)")
    return args


def client_ports(args):
    """``{(threads, number): port}`` for every client part of the build."""
    return {(t, n): args.port + 10 * i + n
            for i, t in enumerate(args.threads) for n in range(1, max(args.clients) + 1)}


def build(args, config):
    """Build the clients' parts (pyruvate, ``threads = t``) in ``args.build``
    (:func:`loadtests.serverbuild.build_parts`); raise RuntimeError on failure."""
    zeo_address, blob_storage = zeo_server(config)
    parts = [(f"s{t}_{n}", "pyruvate", port, t) for (t, n), port in client_ports(args).items()]
    serverbuild.build_parts(args.build, parts, zeo_address, blob_storage, timeout=900)


def measure(args, config, wrk, balancer_dir, threads, count, clients, ports, binary):
    """One cell: temporary HAProxy over clients 1..count (the stack's own HAProxy rendered
    with these servers, leastconn), warm-up, wrk; returns a dict."""
    servers = [{"name": f"s{threads}_{n}", "host": "127.0.0.1", "port": ports[(threads, n)],
                "maxconn": threads, "wsgi_server": "pyruvate"} for n in range(1, count + 1)]
    with TemporaryBalancer(binary, config, "leastconn", balancer_dir, args.port + 90, servers=servers) as balancer:
        balancer.start(BACKEND, [s["name"] for s in servers], timeout=60)
        url = balancer.frontend_url + args.path
        # warm-up: fills the caches of every client
        run_wrk(url, max(2, count * threads), 3, threads=2, timeout=60, wrk=wrk)
        before = haproxy_stats.fetch(balancer.stats_url)
        procs = {**stack_pids(config), **{f"s{threads}_{n}": clients[n]
                                          for n in range(1, count + 1)}}
        cpu_before, busy_before = cpu_seconds(procs), machine_busy_seconds()
        summary = run_wrk(url, args.connections, args.duration, threads=2, timeout=60, wrk=wrk)
        busy = machine_busy_seconds() - busy_before
        used = sum(cpu_seconds(procs).values()) - sum(cpu_before.values())
        after = haproxy_stats.fetch(balancer.stats_url)
    sessions = {n: d["stot"] for n, d in haproxy_stats.deltas(before, after, BACKEND).items()}
    seconds = summary["duration_us"] / 1e6
    total = sum(sessions.values()) or 1
    cores = psutil.cpu_count() or 1
    return {
        "threads": threads, "clients": count,
        "requests": summary["requests"], "rps": round(summary["requests"] / seconds, 1),
        "p50_s": round(summary["latency_us"]["p50"] / 1e6, 3),
        "p99_s": round(summary["latency_us"]["p99"] / 1e6, 3),
        "socket_errors": sum(summary["errors"][k] for k in ("connect", "read", "write", "timeout")),
        "non_2xx": summary["errors"]["status"],
        "share": {n: round(s / total, 3) for n, s in sessions.items()},
        # busy time not spent by the stack, the clients or wrk+HAProxy (approximate: wrk
        # and the temporary HAProxy are counted as foreign)
        "foreign_percent": round(100 * max(busy - used, 0.0) / (seconds * cores), 1),
    }


def summarise(cells):
    """Mean req/s per (threads, clients) over rounds, and the ratio to 1 client (same threads)."""
    table = {}
    for cell in cells:
        table.setdefault((cell["threads"], cell["clients"]), []).append(cell)
    rows = []
    for (threads, count), runs in sorted(table.items()):
        rps = sum(r["rps"] for r in runs) / len(runs)
        rows.append({"threads": threads, "clients": count, "rps": round(rps, 1), "runs": len(runs),
                     "p50_s": round(sum(r["p50_s"] for r in runs) / len(runs), 3),
                     "p99_s": round(sum(r["p99_s"] for r in runs) / len(runs), 3),
                     "errors": sum(r["socket_errors"] + r["non_2xx"] for r in runs),
                     "foreign_percent": round(sum(r["foreign_percent"] for r in runs) / len(runs), 1)})
    base = {r["threads"]: r["rps"] for r in rows if r["clients"] == 1}
    for row in rows:
        row["ratio_to_one_client"] = round(row["rps"] / base[row["threads"]], 2) if base.get(row["threads"]) else None
    return rows


def to_markdown(rows, meta):
    lines = [f"# {meta['path']} across ZEO clients ({meta['cores']} cores, pyruvate, leastconn)", "",
             f"{meta['started']}; wrk {meta['connections']} connections, {meta['duration_s']} s per cell, "
             f"{meta['rounds']} round(s).", "",
             markdown_table(["threads", "clients", "req/s", "x 1 client", "p50 s", "p99 s", "errors",
                             "foreign CPU %"],
                            [[r[k] for k in ("threads", "clients", "rps", "ratio_to_one_client", "p50_s", "p99_s",
                                             "errors", "foreign_percent")] for r in rows])]
    return "\n".join(lines) + "\n"


def plot(rows, path, title):

    fig, ax = new_figure(figsize=(6, 4))
    for threads in sorted({r["threads"] for r in rows}):
        mine = [r for r in rows if r["threads"] == threads]
        ax.plot([r["clients"] for r in mine], [r["rps"] for r in mine], marker="o", label=f"threads = {threads}")
    ax.set_xlabel("ZEO clients on the host")
    ax.set_ylabel("requests/s")
    ax.set_title(title)
    ax.set_xticks(sorted({r["clients"] for r in rows}))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


@exits_2_when_not_ready("scaling")
def main(argv=None):
    args = parse_args(argv)
    wrk = require_wrk()
    config = load_stack()
    running_zeo_server(config)  # before building: a RelStorage stack or a stopped ZEO server
    fetch_stats(config)
    binary = config["haproxy_binary"]
    started = datetime.now(timezone.utc)
    folder = report_folder(args.out, "scaling", started)
    cells_total = len(args.threads) * len(args.clients) * args.rounds
    print(f"building {args.build} ...", flush=True)
    try:
        build(args, config)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"{cells_total} cells x ({args.duration} + 3) s, plus starting {max(args.clients)} clients per "
          f"threads value: about {cells_total * (args.duration + 8) + len(args.threads) * max(args.clients) * 15} s",
          flush=True)
    ports, cells, done = client_ports(args), [], 0
    for threads in args.threads:
        # Clients 1..max of this threads value, one after another (each its own stage).
        processes = serverbuild.run_config(args.build, [(f"s{threads}_{n}", ports[(threads, n)])
                                                        for n in range(1, max(args.clients) + 1)])
        clients = {}
        try:
            started_procs = extrabuild.start(processes, timeout=180)
            clients = {n: started_procs[f"s{threads}_{n}"] for n in range(1, max(args.clients) + 1)}
            for round_number in range(args.rounds):
                order = args.clients if round_number % 2 == 0 else list(reversed(args.clients))
                for count in order:
                    cell = measure(args, config, wrk, os.path.join(folder, f"haproxy-t{threads}-n{count}"),
                                   threads, count, clients, ports, binary)
                    cell["round"] = round_number + 1
                    cells.append(cell)
                    done += 1
                    print(f"[{done}/{cells_total}] threads {threads}, {count} client(s): {cell['rps']} req/s, "
                          f"p99 {cell['p99_s']} s, errors {cell['socket_errors'] + cell['non_2xx']}, "
                          f"foreign CPU {cell['foreign_percent']} %", flush=True)
        except (RuntimeError, BalancerError, StackError) as exc:
            print(exc, file=sys.stderr)
            return 2
        finally:
            extrabuild.stop(processes)
    rows = summarise(cells)
    meta = {"started": started.isoformat(timespec="seconds"), "path": args.path,
            "connections": args.connections, "duration_s": args.duration, "rounds": args.rounds,
            "cores": psutil.cpu_count()}
    text = to_markdown(rows, meta)
    write_report(folder, {"meta": meta, "rows": rows, "cells": cells}, text, [
        ("scaling.png", lambda path: plot(rows, path, f"{args.path}: req/s by ZEO clients"))])
    print(text)
    print(f"report: {folder}")
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
