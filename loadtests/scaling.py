"""Scaling across ZEO clients on one host: /Plone throughput with 1..N clients x threads.

Usage (stack running with the site, ``make start``; ``wrk`` on PATH)::

    .venv/bin/python -m loadtests.scaling [--clients 1,2,3,4] [--threads 1,2,4]
        [--duration 20] [--connections 32] [--rounds 1] [--path /Plone]
        [--build var/scaling] [--port 8300] [--out var/reports]

Builds ``--build`` (a buildout with one pyruvate ZEO client part ``s<threads>_<i>`` per
threads value and client number, all ZEO clients of the stack's zeoserver, ports
``--port`` + 10 x (index of the threads value) + i) unless built. Then, per threads value:
starts clients 1..max one after another, and for each client count n (rounds alternate
the order: 1..N, then N..1) renders the project's haproxy/haproxy.cfg.j2 for clients
1..n (leastconn, maxconn = threads) into a temporary HAProxy on ``--port`` + 90/91,
warms up for 3 s, and runs wrk with ``--connections`` keep-alive connections on
``--path`` for ``--duration`` seconds. The clients are stopped after their threads value.

Per cell (threads, clients): requests/s (mean over rounds), the ratio to one client at
the same threads, p50/p99 latency (seconds), socket errors and non-2xx, each server's
share of HAProxy's sessions, and the CPU load of foreign processes. Output: a table on
stdout and ``<out>/scaling-<YYYYmmdd-HHMMSS>/`` with ``report.json``, ``report.md`` and
``scaling.png`` (req/s against clients, one line per threads value).

Exit status 0, 1 if a cell had socket errors or non-2xx answers, 2 when the stack is not
running, wrk is missing, an option is invalid or a client does not start.
Traffic goes only to 127.0.0.1.
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

import psutil
import requests

from loadtests import haproxy_stats, serverbuild
from loadtests.balancers import BalancerError, TemporaryBalancer
from loadtests.core import (add_run_arguments, cpu_seconds, exits_2_when_not_ready, fetch_stats, load_stack,
                            machine_busy_seconds, markdown_table, new_figure, parse_counts, report_folder,
                            require_wrk, run_wrk, save_figure, stack_pids, write_report)
from plonedeploy.recipe import edge, tls
from plonedeploy.recipe.options import TEMPLATES_DIRECTORY, render_template

ROOT = serverbuild.ROOT
BACKEND = "zeoclients"

PART = """
[s{threads}_{number}]
<= client
wsgi-server = pyruvate
threads = {threads}
http-address = 127.0.0.1:{port}
"""


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m loadtests scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1,2,3,4",
                        help="client counts to measure (default 1,2,3,4)")
    parser.add_argument("--threads", default="1,2,4",
                        help="threads per client (default 1,2,4); pool-size follows")
    add_run_arguments(parser, duration=20, rounds=1)
    parser.add_argument("--connections", type=int, default=32,
                        help="wrk connections, the same for every cell (default 32)")
    parser.add_argument("--path", default="/Plone", help="path to request (default /Plone)")
    parser.add_argument("--build", default=os.path.join(ROOT, "var", "scaling"),
                        help="buildout directory for the clients (default var/scaling)")
    parser.add_argument("--port", type=int, default=8300,
                        help="first port (default 8300: clients 8301.., balancer 8390/8391)")
    parser.add_argument("--out", default=os.path.join(ROOT, "var", "reports"), help="report folder")
    args = parser.parse_args(argv)
    args.clients = sorted(set(parse_counts(parser, "--clients", args.clients)))
    args.threads = sorted(set(parse_counts(parser, "--threads", args.threads)))
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
    """Write and run the clients' buildout in ``args.build``; raise RuntimeError on failure."""
    zeo = next(p for p in config["processes"] if "tcp" in p["ready"])
    zeo_address = "%s:%s" % tuple(zeo["ready"]["tcp"])
    directory = pathlib.Path(args.build)
    directory.mkdir(parents=True, exist_ok=True)
    parts = [f"s{t}_{n}" for (t, n) in client_ports(args)]
    text = serverbuild.HEAD.format(root=ROOT, parts=" ".join(parts), zeo_address=zeo_address,
                                   blob_storage=os.path.join(ROOT, "var", "blobstorage"))
    text += "".join(PART.format(threads=t, number=n, port=p) for (t, n), p in client_ports(args).items())
    (directory / "buildout.cfg").write_text(text)
    result = subprocess.run([serverbuild.BUILDOUT, "-c", str(directory / "buildout.cfg")], cwd=directory,
                            capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"bin/buildout in {directory} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


class ScalingBalancer(TemporaryBalancer):
    """A temporary HAProxy rendered from the project's template for clients 1..n."""

    def __init__(self, binary, directory, frontend_port, servers):
        super().__init__(binary, None, "leastconn", directory, frontend_port)
        self.servers = servers  # [{"name", "host", "port", "maxconn", "wsgi_server"}]
        # The runtime API socket path must stay under 98 bytes: a short directory of its own.
        self.run_directory = tempfile.mkdtemp(prefix="pd-scaling-")

    def stop(self, timeout=10.0):
        super().stop(timeout)
        shutil.rmtree(self.run_directory, ignore_errors=True)

    def config_text(self):
        return render_template(os.path.join(TEMPLATES_DIRECTORY, "haproxy.cfg.j2"), {
            "part": "loadtests.scaling", "servers": self.servers,
            "bind": f"127.0.0.1:{self.frontend_port}", "stats_bind": f"127.0.0.1:{self.stats_port}",
            "balance": "leastconn", "health_check": "/Plone/@@ok", "timeout_queue": 60,
            "max_body_size": 1073741824, "maxconn": 4096, "manage_networks": [],
            # HAProxy's own sizing (2 fds per connection): no ulimit-n / strict-limits lines
            "fd_limit": 2 * (4096 + 16) + 64,
            "run_directory": self.run_directory,
            # Its load comes from 127.0.0.1: not limited per source.
            **edge.template_context(["127.0.0.1"], per_source_exempt=["127.0.0.1/32"]),
            **tls.template_context("", "", False, 0),  # plain HTTP only
        })


def start_client(args, threads, number, port, log_dir):
    """Start client s<threads>_<number>; wait until ``GET /`` answers. Returns the Popen."""
    name = f"s{threads}_{number}"
    proc = _start(args.build, name, os.path.join(log_dir, f"{name}.log"))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with status {proc.returncode}; see {log_dir}/{name}.log")
        try:
            if requests.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.5)
    serverbuild.stop(proc)
    raise RuntimeError(f"{name} not answering on port {port} after 180 s")


def _start(directory, part, log_path):
    """``bin/<part> console`` in its own process group (as bin/stack starts clients)."""
    directory = os.path.abspath(directory)
    with open(log_path, "w") as out:
        return subprocess.Popen([os.path.join(directory, "bin", part), "console"], cwd=directory,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def measure(args, config, wrk, balancer_dir, threads, count, clients, ports, binary):
    """One cell: temporary HAProxy over clients 1..count, warm-up, wrk; returns a dict."""
    servers = [{"name": f"s{threads}_{n}", "host": "127.0.0.1", "port": ports[(threads, n)],
                "maxconn": threads, "wsgi_server": "pyruvate"} for n in range(1, count + 1)]
    with ScalingBalancer(binary, balancer_dir, args.port + 90, servers) as balancer:
        balancer.start(BACKEND, [s["name"] for s in servers], timeout=60)
        url = balancer.frontend_url + args.path
        # warm-up: fills the caches of every client
        run_wrk(url, max(2, count * threads), 3, threads=2, timeout=60, wrk=wrk)
        before = haproxy_stats.fetch(balancer.stats_url)
        procs = {**stack_pids(config), **{f"s{threads}_{n}": psutil.Process(clients[n].pid)
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
        clients = {}
        try:
            for number in range(1, max(args.clients) + 1):
                clients[number] = start_client(args, threads, number, ports[(threads, number)], folder)
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
        except (RuntimeError, BalancerError) as exc:
            print(exc, file=sys.stderr)
            return 2
        finally:
            for proc in clients.values():
                serverbuild.stop(proc)
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
