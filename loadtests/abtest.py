"""Run the A/B load test through HAProxy and write a report.

Usage (stack running, site created; see ``make start``)::

    .venv/bin/python -m loadtests.abtest [--users 10] [--spawn-rate 10] [--duration 60]
        [--weights root=1,plone=1,json=1,blob=1] [--out var/reports]

Reads ``parts/stack/stack.json`` (written by bin/buildout) for the HAProxy frontend, stats
URL, backend and which WSGI server each ZEO client runs. Then:

1. checks that HAProxy reports every server UP (else exit 2, nothing run);
2. reads HAProxy's stats CSV and the CPU times of the machine and of the stack's processes;
3. runs Locust headless (``loadtests/locustfile.py``) for ``--duration`` seconds,
   printing a progress line every 5 s (elapsed, requests so far per server);
4. reads the stats again and writes ``<out>/<YYYYmmdd-HHMMSS>/`` with ``report.md``,
   ``report.json``, ``ab.png`` and Locust's own CSV/HTML;
5. prints the summary table and the report's path.

Exit status: 0 when every request passed its check, 1 when some failed (the report is
written all the same), 2 when the stack is not ready or an option is invalid.
Traffic goes only to the HAProxy frontend of this buildout (127.0.0.1).
"""
import argparse
import importlib.metadata
import json
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone

import psutil

from loadtests import haproxy_stats, report
from loadtests.weights import DEFAULT_WEIGHTS, parse_weights

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def stack_pids(config):
    """Return ``{process name: psutil.Process}`` for the stack's running processes."""
    procs = {}
    for proc in config["processes"]:
        try:
            with open(os.path.join(config["run_dir"], f"{proc['name']}.pid"), encoding="ascii") as fp:
                procs[proc["name"]] = psutil.Process(int(fp.read().split()[0]))
        except (OSError, ValueError, psutil.Error):
            pass
    return procs


def cpu_seconds(processes):
    """Return ``{name: user+system CPU seconds}`` for psutil processes (gone ones skipped)."""
    out = {}
    for name, proc in processes.items():
        try:
            t = proc.cpu_times()
            out[name] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return out


def own_cpu_seconds():
    """CPU seconds of this process and its waited-for children (Locust), user + system."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def machine_busy_seconds():
    """CPU seconds the whole machine spent not idle (all cores summed)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.abtest",
        description="A/B load test of the ZEO clients behind HAProxy; writes var/reports/<timestamp>/.",
    )
    parser.add_argument("--users", type=int, default=10,
                        help="concurrent Locust users (closed loop, no think time); default 10")
    parser.add_argument("--spawn-rate", type=float, default=10.0,
                        help="users started per second; default 10")
    parser.add_argument("--duration", type=int, default=60, help="run time in seconds; default 60")
    parser.add_argument("--weights", default=DEFAULT_WEIGHTS,
                        help=f"users per traffic shape (root, plone, json, blob); default {DEFAULT_WEIGHTS}")
    parser.add_argument("--stack-config", default=os.path.join(ROOT, "parts", "stack", "stack.json"),
                        help="stack.json written by bin/buildout; default parts/stack/stack.json")
    parser.add_argument("--out", default=os.path.join(ROOT, "var", "reports"),
                        help="directory for report folders; default var/reports")
    args = parser.parse_args(argv)
    if args.users < 1 or args.duration < 1 or args.spawn_rate <= 0:
        parser.error("--users and --duration must be >= 1 and --spawn-rate > 0")
    try:
        parse_weights(args.weights)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def run_locust(args, config, directory):
    """Run Locust headless into ``directory``; print progress every 5 s; return its exit code."""
    cmd = [
        sys.executable, "-m", "locust", "-f", os.path.join(HERE, "locustfile.py"),
        "--headless", "--only-summary",
        "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
        "--run-time", f"{args.duration}s", "--stop-timeout", "10",
        "--host", config["frontend_url"],
        "--weights", args.weights,
        "--csv", os.path.join(directory, "locust"),
        "--html", os.path.join(directory, "locust.html"),
        "--per-server-stats", os.path.join(directory, "per_server.json"),
        "--loglevel", "WARNING",
    ]
    log_path = os.path.join(directory, "locust.log")
    with open(log_path, "wb") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=directory)
        started = time.monotonic()
        next_report = started + 5.0
        before = haproxy_stats.fetch(config["stats_url"])
        while child.poll() is None:
            time.sleep(0.2)
            now = time.monotonic()
            elapsed = now - started
            if now >= next_report:
                next_report += 5.0
                try:
                    delta = haproxy_stats.deltas(before, haproxy_stats.fetch(config["stats_url"]),
                                                 config["backend"])
                    counts = ", ".join(f"{n} {d['stot']}" for n, d in delta.items())
                except OSError:
                    counts = "stats not answering"
                print(f"  {min(elapsed, args.duration):5.0f}/{args.duration} s  requests: {counts}",
                      flush=True)
    with open(log_path, encoding="utf-8", errors="replace") as fp:
        summary = fp.read()
    print(summary[-4000:] if child.returncode not in (0, 1) else "", end="")
    return child.returncode


def main(argv=None):
    """Entry point; see the module docstring."""
    args = parse_args(argv)
    if not os.path.exists(args.stack_config):
        print(f"abtest: {args.stack_config} not found: run bin/buildout first", file=sys.stderr)
        return 2
    with open(args.stack_config, encoding="utf-8") as fp:
        config = json.load(fp)
    try:
        rows = haproxy_stats.fetch(config["stats_url"])
    except OSError as exc:
        print(f"abtest: HAProxy stats at {config['stats_url']} not answering ({exc}): "
              "start the stack with 'make start'", file=sys.stderr)
        return 2
    states = {n: r["status"] for n, r in haproxy_stats.servers(rows, config["backend"]).items()}
    if not states or any(s != "UP" for s in states.values()):
        print(f"abtest: not every server is UP: {states}; see 'bin/stack status'", file=sys.stderr)
        return 2

    started = datetime.now(timezone.utc)
    directory = os.path.join(args.out, started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(directory, exist_ok=True)
    print(f"A/B run: {args.users} users, {args.duration} s, weights {args.weights}, "
          f"through {config['frontend_url']} -> "
          + ", ".join(f"{n} ({config['server_kinds'][n]})" for n in config["servers"]),
          flush=True)

    procs = stack_pids(config)
    cpu_before, busy_before = cpu_seconds(procs), machine_busy_seconds()
    own_before = own_cpu_seconds()
    wall_before = time.monotonic()
    before = haproxy_stats.fetch(config["stats_url"])
    code = run_locust(args, config, directory)
    after = haproxy_stats.fetch(config["stats_url"])
    wall = time.monotonic() - wall_before
    cpu_after, busy_after = cpu_seconds(procs), machine_busy_seconds()
    own = own_cpu_seconds() - own_before

    per_server_path = os.path.join(directory, "per_server.json")
    if code not in (0, 1) or not os.path.exists(per_server_path):
        print(f"abtest: Locust exited with status {code}; see {directory}/locust.log", file=sys.stderr)
        return 2
    with open(per_server_path, encoding="utf-8") as fp:
        per_server = json.load(fp)

    stack_cpu = {n: cpu_after.get(n, 0.0) - cpu_before.get(n, 0.0) for n in cpu_before}
    busy = busy_after - busy_before
    cores = psutil.cpu_count() or 1
    foreign = max(busy - sum(stack_cpu.values()) - own, 0.0)

    meta = {
        "started": started.isoformat(timespec="seconds"),
        "duration_s": args.duration,
        "wall_s": round(wall, 1),
        "users": args.users,
        "spawn_rate": args.spawn_rate,
        "weights": args.weights,
        "host": config["frontend_url"],
        "balance": config.get("balance"),
        "locust_version": importlib.metadata.version("locust"),
        "locust_exit_code": code,
        "cpu": {
            "cores": cores,
            "machine_busy_s": round(busy, 2),
            "stack_cpu_s": {n: round(v, 2) for n, v in stack_cpu.items()},
            "load_generator_cpu_s": round(own, 2),
            # Everything else the machine did meanwhile: other users' processes.
            "foreign_cpu_s": round(foreign, 2),
            "foreign_percent": round(100.0 * foreign / (wall * cores), 1),
        },
    }
    data = report.build(
        meta,
        haproxy_stats.deltas(before, after, config["backend"]),
        per_server,
        {name: config["server_kinds"][name] for name in config["servers"]},
    )
    _, md_path, png_path = report.write(data, directory)
    print()
    print(report.summary_table(data))
    print()
    totals = data["totals"]
    print(f"total {totals['requests']} requests, {totals['failures']} failures, "
          f"{totals['rps']:.1f} req/s")
    print(f"report: {md_path}")
    print(f"plot:   {png_path}")
    return 0 if totals["failures"] == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
