"""Quick side-by-side figure per WSGI server: wrk on ``/`` direct to one ZEO client.

Usage (stack running with the site, ``make start``; ``wrk`` on PATH)::

    .venv/bin/python -m loadtests.servers_wrk [--servers gunicorn,cheroot,...]
        [--connections 10] [--duration 5] [--path /] [--build var/servers-bench]

Builds ``--build`` (loadtests/serverbuild.py: one ZEO client part per server, ZEO clients of
the stack's zeoserver, on the ports after the stack's client2) unless it is built, then
for each server in turn: starts its client, waits for ``GET <path>`` to answer 200, runs
``wrk -t1 -c<connections> -d<duration>s`` (loadtests.core.run_wrk) against the stack's pyruvate client
(``instance``) and then against the server's client, stops the client, and prints one row:
requests/s of each, the ratio server/pyruvate, p50/p99 latency (ms) from wrk, non-2xx
responses and socket errors, and the CPU load of other processes on the machine during
the two runs (``foreign %`` of all cores: machine busy time minus the stack's, the
client's and wrk's CPU time). Quick and noisy: 5 s runs on a shared 2-core machine;
compare ratios within one run, not absolute figures across runs.

Exit status: 0, or 2 if the stack is not running, is a RelStorage build (no ZEO server for
the clients; core.running_zeo_server) or wrk is missing. Traffic goes only to 127.0.0.1.
"""
import os
import sys
import time

import psutil
import requests

from loadtests import extrabuild, serverbuild
from loadtests.core import (ROOT, add_run_arguments, client_urls, cpu_seconds, exits_2_when_not_ready,
                            load_stack, machine_busy_seconds, new_parser, require_wrk, run_wrk,
                            running_zeo_server, stack_pids, tree_processes, zeo_server)
from plonedeploy.recipe.stack import StackError


def wrk_row(summary):
    """``{"rps", "p50_ms", "p99_ms", "non_2xx", "socket_errors"}`` of one
    :func:`loadtests.core.run_wrk` summary: requests/s, latencies in ms, counts."""
    seconds = summary["duration_us"] / 1e6
    errors = summary["errors"]
    return {
        "rps": round(summary["requests"] / seconds, 2) if seconds else 0.0,
        "p50_ms": round(summary["latency_us"]["p50"] / 1000, 2),
        "p99_ms": round(summary["latency_us"]["p99"] / 1000, 2),
        "non_2xx": errors["status"],
        "socket_errors": sum(errors[k] for k in ("connect", "read", "write", "timeout")),
    }


def measure(url, connections, duration):
    """One wrk run (one thread) on ``url``; returns (:func:`wrk_row`, wrk's CPU seconds)."""
    # wrk's own default timeout: a response slower than 2 s counts as a socket error.
    summary = run_wrk(url, connections, duration, threads=1, timeout=2)
    return wrk_row(summary), summary["cpu_s"]


def group_processes(proc):
    """``{"client-<pid>": psutil.Process}`` of the client ``proc`` (psutil) and its descendants."""
    return {f"client-{p.pid}": p for p in tree_processes(proc.pid)}


@exits_2_when_not_ready("servers_wrk")
def main(argv=None):
    parser = new_parser("servers-wrk", __doc__.split("\n\n")[0])
    others = [s for s in serverbuild.SERVERS if s != "pyruvate"]
    parser.add_argument("--servers", default=",".join(others),
                        help=f"comma-separated wsgi-server values (default: {','.join(others)})")
    parser.add_argument("--connections", type=int, default=10, help="wrk connections (default 10)")
    add_run_arguments(parser, duration=5)
    parser.add_argument("--path", default="/", help="request path (default /, the Zope root)")
    parser.add_argument("--build", default=os.path.join(ROOT, "var", "servers-bench"),
                        help="directory of the servers buildout (default var/servers-bench)")
    args = parser.parse_args(argv)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [s for s in servers if s not in serverbuild.SERVERS]
    if unknown:
        parser.error(f"unknown server(s) {unknown}; expected some of {list(serverbuild.SERVERS)}")
    require_wrk()
    config = load_stack()
    running_zeo_server(config)  # before building: a RelStorage stack or a stopped ZEO server
    stack = stack_pids(config)
    if "instance" not in stack:
        print("servers_wrk: the stack's instance must run (make start)", file=sys.stderr)
        return 2
    reference = client_urls(config, ["instance"])["instance"]
    zeo_address, blob_storage = zeo_server(config)
    base_port = max(int(url.rsplit(":", 1)[1]) for url in client_urls(config).values()) + 1

    build = args.build
    os.makedirs(build, exist_ok=True)
    if not all(os.path.exists(os.path.join(build, "bin", f"c_{s}")) for s in servers):
        print(f"building {build} ...", flush=True)
        try:
            serverbuild.build(build, base_port, zeo_address, blob_storage)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 2
    ports = serverbuild.ports(base_port)
    clients = serverbuild.run_config(build, [(f"c_{s}", ports[s]) for s in servers])
    cores = psutil.cpu_count() or 1

    print(f"wrk -t1 -c{args.connections} -d{args.duration}s {args.path} direct to each client; "
          f"reference: pyruvate {reference} (the stack's instance). Quick and noisy.")
    header = (f"{'server':<9} {'req/s':>8} {'pyruvate':>9} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'pyr p50':>7} {'non2xx':>6} {'errors':>6} {'foreign %':>9}")
    print(header)
    print("-" * len(header))
    for server in servers:
        url = f"http://127.0.0.1:{ports[server]}"
        try:
            proc = extrabuild.start(clients, [f"c_{server}"], timeout=180)[f"c_{server}"]
            # warm the client's caches once; a supervisor may answer before its worker serves
            status = requests.get(url + args.path, timeout=60).status_code
            if status != 200:
                raise RuntimeError(f"{url + args.path} answered {status}")
            watched = dict(stack, **group_processes(proc))
            busy0, cpu0 = machine_busy_seconds(), cpu_seconds(watched)
            t0 = time.monotonic()
            ref, wrk_cpu_a = measure(reference + args.path, args.connections, args.duration)
            res, wrk_cpu_b = measure(url + args.path, args.connections, args.duration)
            wall = time.monotonic() - t0
            cpu1 = cpu_seconds(watched)
            ours = sum(cpu1.get(n, 0.0) - cpu0.get(n, 0.0) for n in cpu0) + wrk_cpu_a + wrk_cpu_b
            foreign = max(machine_busy_seconds() - busy0 - ours, 0.0)
            ratio = res["rps"] / ref["rps"] if ref["rps"] else float("nan")
            print(f"{server:<9} {res['rps']:>8.1f} {ref['rps']:>9.1f} {ratio:>6.2f} {res['p50_ms']!s:>7} "
                  f"{res['p99_ms']!s:>7} {ref['p50_ms']!s:>7} {res['non_2xx']:>6} "
                  f"{res['socket_errors']:>6} {100.0 * foreign / (wall * cores):>9.1f}", flush=True)
        except (RuntimeError, StackError, requests.RequestException) as exc:
            print(f"{server:<9} failed: {exc}; see {build}/log/c_{server}.stdout.log", flush=True)
        finally:
            extrabuild.stop(clients, [f"c_{server}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
