"""Run the A/B load test through HAProxy and write a report.

Usage (stack running, site created; see ``make start``)::

    .venv/bin/python -m loadtests.abtest [--users 10] [--spawn-rate 10] [--duration 60]
        [--weights root=1,plone=1,json=1,blob=1] [--out var/reports]
        [--balance leastconn,roundrobin [--rounds 1] [--balancer-port PORT]]

Reads ``parts/stack/stack.json`` (written by bin/buildout) for the HAProxy frontend, stats
URL, backend and which WSGI server each ZEO client runs. Then:

1. checks that HAProxy reports every server UP (else exit 2, nothing run);
2. reads HAProxy's stats CSV and the CPU times of the machine and of the stack's processes;
3. runs Locust headless (``loadtests/locustfile.py``) for ``--duration`` seconds,
   printing a progress line every 5 s (elapsed, requests so far per server);
4. reads the stats again and writes ``<out>/<YYYYmmdd-HHMMSS>/`` with ``report.md``,
   ``report.json``, ``ab.png`` and Locust's own CSV/HTML;
5. prints the summary table and the report's path.

Per balance mode (``--balance leastconn,roundrobin [--rounds N] [--balancer-port P]``):
the deployed HAProxy's ``balance`` cannot change at runtime, so each mode runs through a
temporary HAProxy of its own (``loadtests.balancers``: the deployed config with only
``balance`` and the ports changed, checked with ``haproxy -c``, on 127.0.0.1:P and P+1,
default P = deployed frontend port + 10) in front of the same two running ZEO clients;
steps 2-4 run once per mode and round (``--duration`` seconds each; modes interleaved in
every round), each writing its full single-mode report into ``<out>/<ts>/<mode>-r<round>/``
and stopping its HAProxy by PID before the next starts. ``<out>/<ts>/`` then gets the
per-mode ``report.md``, ``report.json`` and ``modes.png`` (``loadtests.modes_report``).
Without ``--balance``, or with only the deployed mode, the run is the plain one above
through the deployed HAProxy, with unchanged output.

Exit status: 0 when every request passed its check, 1 when some failed (the report is
written all the same), 2 when the stack is not ready, an option is invalid (e.g. a
``--balance`` mode not in ``loadtests.balancers.MODES``) or a temporary HAProxy could
not start. Traffic goes only to HAProxy frontends on 127.0.0.1.
"""
import argparse
import importlib.metadata
import json
import os
import resource
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from urllib.parse import urlsplit

import psutil

from loadtests import balancers, haproxy_stats, modes_report, report
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
    parser.add_argument("--balance", default=None,
                        help="comma-separated HAProxy balance modes to compare, each through its own "
                        f"temporary HAProxy; allowed: {', '.join(balancers.MODES)}; default: the "
                        "deployed HAProxy's mode only, through the deployed HAProxy (the plain A/B run)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --balance: runs per mode, modes interleaved in each round; default 1 "
                        "(--duration is per mode and round)")
    parser.add_argument("--balancer-port", type=int, default=None,
                        help="with --balance: 127.0.0.1 port of the temporary HAProxy's frontend, its "
                        "stats on the next port; default the deployed frontend port + 10")
    args = parser.parse_args(argv)
    if args.users < 1 or args.duration < 1 or args.spawn_rate <= 0 or args.rounds < 1:
        parser.error("--users, --duration and --rounds must be >= 1 and --spawn-rate > 0")
    if args.balancer_port is not None and not 1 <= args.balancer_port <= 65534:
        parser.error("--balancer-port must be between 1 and 65534 (the stats use the next port)")
    try:
        parse_weights(args.weights)
        if args.balance is not None:
            args.balance = balancers.parse_modes(args.balance)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def run_locust(args, config, directory, label=""):
    """Run Locust headless into ``directory``; print progress every 5 s; return its exit code.

    Traffic goes to ``config["frontend_url"]``; progress counts come from
    ``config["stats_url"]``; ``label`` prefixes the progress lines.
    """
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
        try:
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
                    print(f"  {label}{min(elapsed, args.duration):5.0f}/{args.duration} s  requests: {counts}",
                          flush=True)
        finally:
            # Interrupted (Ctrl-C, SIGTERM): Locust must not keep sending traffic.
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(15)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    with open(log_path, encoding="utf-8", errors="replace") as fp:
        summary = fp.read()
    print(summary[-4000:] if child.returncode not in (0, 1) else "", end="")
    return child.returncode


def measure(args, config, directory, label="", balancer=None):
    """One Locust run through ``config["frontend_url"]``, measured and reported into ``directory``.

    Reads HAProxy's stats (``config["stats_url"]``) and CPU times before and after; ``balancer``
    (a psutil.Process) is a temporary HAProxy whose CPU counts as the stack's. Returns
    ``(report dict, Locust exit code, per-server JSON)``, or ``None`` (message printed) when
    Locust did not produce its results.
    """
    procs = stack_pids(config)
    if balancer is not None:
        procs["balancer"] = balancer
    cpu_before, busy_before = cpu_seconds(procs), machine_busy_seconds()
    own_before = own_cpu_seconds()
    wall_before = time.monotonic()
    started = datetime.now(timezone.utc)
    before = haproxy_stats.fetch(config["stats_url"])
    code = run_locust(args, config, directory, label)
    after = haproxy_stats.fetch(config["stats_url"])
    wall = time.monotonic() - wall_before
    cpu_after, busy_after = cpu_seconds(procs), machine_busy_seconds()
    own = own_cpu_seconds() - own_before

    per_server_path = os.path.join(directory, "per_server.json")
    if code not in (0, 1) or not os.path.exists(per_server_path):
        print(f"abtest: Locust exited with status {code}; see {directory}/locust.log", file=sys.stderr)
        return None
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
    return data, code, per_server


def load_stack(path):
    """Read stack.json and check the deployed HAProxy has every server UP.

    Returns the config dict, or None after printing why (the caller exits 2).
    """
    if not os.path.exists(path):
        print(f"abtest: {path} not found: run bin/buildout first", file=sys.stderr)
        return None
    with open(path, encoding="utf-8") as fp:
        config = json.load(fp)
    try:
        rows = haproxy_stats.fetch(config["stats_url"])
    except OSError as exc:
        print(f"abtest: HAProxy stats at {config['stats_url']} not answering ({exc}): "
              "start the stack with 'make start'", file=sys.stderr)
        return None
    states = {n: r["status"] for n, r in haproxy_stats.servers(rows, config["backend"]).items()}
    if not states or any(s != "UP" for s in states.values()):
        print(f"abtest: not every server is UP: {states}; see 'bin/stack status'", file=sys.stderr)
        return None
    return config


def run_deployed(args, config, directory):
    """The single-mode A/B run through the deployed HAProxy; returns the exit status."""
    print(f"A/B run: {args.users} users, {args.duration} s, weights {args.weights}, "
          f"through {config['frontend_url']} -> "
          + ", ".join(f"{n} ({config['server_kinds'][n]})" for n in config["servers"]),
          flush=True)
    result = measure(args, config, directory)
    if result is None:
        return 2
    data, code, _ = result
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


def haproxy_argv(config):
    """``(binary, config path)`` of the deployed HAProxy, from its argv in stack.json.

    Returns None when the stack config names no HAProxy process (the Ansible role's
    ``abtest.json`` describes only the frontend and stats URLs).
    """
    for proc in config.get("processes", []):
        if proc["argv"][-2:-1] == ["-f"] and os.path.exists(proc["argv"][-1]):
            return proc["argv"][0], proc["argv"][-1]
    return None


def run_modes(args, config, directory, modes):
    """One run per mode and round, each through its own temporary HAProxy; returns the exit status.

    Rounds interleave the modes (round 1: all modes, round 2: all modes, ...) so that
    machine noise hits every mode alike. Each run's full single-mode report goes to
    ``<directory>/<mode>-r<round>/``; the per-mode report to ``<directory>/``.
    """
    binary, deployed_config = haproxy_argv(config)
    total_s = args.duration * len(modes) * args.rounds
    print(f"A/B run per balance mode: {', '.join(modes)}; {args.rounds} round(s) x {args.duration} s "
          f"per mode (about {total_s // 60} min {total_s % 60} s of load), {args.users} users, "
          f"weights {args.weights}; temporary HAProxy on 127.0.0.1:{args.balancer_port} "
          f"(stats :{args.balancer_port + 1}) -> "
          + ", ".join(f"{n} ({config['server_kinds'][n]})" for n in config["servers"]),
          flush=True)
    runs, worst = [], 0
    for round_no in range(1, args.rounds + 1):
        for mode in modes:
            name = f"{balancers.slug(mode)}-r{round_no}"
            run_dir = os.path.join(directory, name)
            balancer = balancers.TemporaryBalancer(binary, deployed_config, mode, run_dir, args.balancer_port)
            with balancer:
                try:
                    balancer.start(config["backend"], config["servers"])
                except balancers.BalancerError as exc:
                    print(f"abtest: {exc}", file=sys.stderr)
                    return 2
                print(f"[{mode}, round {round_no}/{args.rounds}] temporary HAProxy pid {balancer.pid}, "
                      f"servers UP", flush=True)
                mode_config = dict(config, frontend_url=balancer.frontend_url,
                                   stats_url=balancer.stats_url, balance=mode)
                result = measure(args, mode_config, run_dir, f"[{mode}] ", balancer.process)
            print(f"[{mode}, round {round_no}/{args.rounds}] temporary HAProxy pid {balancer.pid} stopped",
                  flush=True)
            if result is None:
                return 2
            data, code, per_server = result
            report.write(data, run_dir)
            shares = ", ".join(f"{n} {100 * (s['share'] or 0):.1f}%" for n, s in data["servers"].items()
                               if n in config["server_kinds"])
            print(f"[{mode}, round {round_no}/{args.rounds}] {data['totals']['requests']} requests, "
                  f"{data['totals']['failures']} failures, {data['totals']['rps']:.1f} req/s; share {shares}; "
                  f"foreign CPU {data['meta']['cpu']['foreign_percent']}%", flush=True)
            worst = max(worst, 0 if data["totals"]["failures"] == 0 and code == 0 else 1)
            # The log is complete now that this HAProxy has stopped.
            logged, queued = balancers.queue_waits(balancer.log_path, config["backend"])
            runs.append({"mode": mode, "round": round_no, "directory": name, "report": data,
                         "per_server": per_server, "balancer_pid": balancer.pid,
                         "queue": {"logged": logged, "queued": queued}})
    meta = {
        "started": os.path.basename(directory),
        "modes": modes,
        "rounds": args.rounds,
        "deployed_balance": config.get("balance"),
        "duration_s": args.duration,
        "users": args.users,
        "spawn_rate": args.spawn_rate,
        "weights": args.weights,
        "balancer_url": f"http://127.0.0.1:{args.balancer_port}",
        "locust_version": importlib.metadata.version("locust"),
        "cores": psutil.cpu_count() or 1,
    }
    data = modes_report.build(meta, runs, {n: config["server_kinds"][n] for n in config["servers"]})
    _, md_path, png_path = modes_report.write(data, directory)
    print()
    print(modes_report.summary_table(data))
    print()
    print(f"report: {md_path}")
    print(f"plot:   {png_path}")
    return worst


def main(argv=None):
    """Entry point; see the module docstring."""
    args = parse_args(argv)
    config = load_stack(args.stack_config)
    if config is None:
        return 2
    modes = args.balance or [config.get("balance")]
    deployed_only = modes == [config.get("balance")]
    if not deployed_only and haproxy_argv(config) is None:
        print(f"abtest: --balance needs the deployed HAProxy's config file, and {args.stack_config} "
              "names no HAProxy process started with -f (run it with a buildout's parts/stack/stack.json)",
              file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc)
    directory = os.path.join(args.out, started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(directory, exist_ok=True)
    if deployed_only:
        return run_deployed(args, config, directory)
    if args.balancer_port is None:
        args.balancer_port = urlsplit(config["frontend_url"]).port + 10
    # A SIGTERM (e.g. from a test's timeout) must still stop the temporary HAProxys:
    # turn it into SystemExit so that the with-blocks' cleanup runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run_modes(args, config, directory, modes)


if __name__ == "__main__":
    sys.exit(main())
