"""One A/B measurement: a Locust run through HAProxy (``run_locust``, ``locust_generator_args``)
with HAProxy's stats and the CPU of the machine, the stack and the load generator before
and after (``measure``), and the warnings when the load generator or the machine may have
set the pace (``saturation_warnings``).
"""
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import psutil

from loadtests.core import haproxy_stats
from loadtests.core.procs import cpu_seconds, free_local_port, machine_busy_seconds, own_cpu_seconds
from loadtests.core.stack import EDITOR_PASSWORD_FILE, HERE, stack_pids


def locust_cpu_seconds():
    """CPU seconds of this process, its finished children and its running Locust processes
    (a Locust still running is not in RUSAGE_CHILDREN yet), user + system. Other running
    children (temporary HAProxys, slot clients) are the stack's, not the load generator's."""
    running = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            if "locust" in " ".join(child.cmdline()):
                t = child.cpu_times()
                running += t.user + t.system
        except psutil.Error:
            pass
    return own_cpu_seconds() + running


#: Above these, the report warns: the load generator (one Locust process, one core at
#: most) or the machine (all cores) rather than the servers may set the pace.
GENERATOR_LIMIT_CORES = 0.8
MACHINE_LIMIT = 0.9


def saturation_warnings(generator_cores, machine_fraction, cores, processes=1):
    """Warnings (list of str) when Locust used more than GENERATOR_LIMIT_CORES of the
    ``processes`` cores its processes can use (each one core at most, gevent), or the
    machine was busier than MACHINE_LIMIT (fraction of all ``cores``)."""
    out = []
    if generator_cores > GENERATOR_LIMIT_CORES * processes:
        out.append(f"the load generator used {generator_cores:.2f} cores of the {processes} its "
                   f"{processes} Locust process(es) can use; it may limit the request rate more than the servers do")
    if machine_fraction > MACHINE_LIMIT:
        out.append(f"the machine was {100 * machine_fraction:.0f}% busy ({cores} cores): the split shows how "
                   "the servers share a saturated machine, not only their own speed")
    return out


def locust_generator_args(args):
    """Locust's options for where the users run: a master waiting up to 60 s for
    ``args.remote_workers`` workers on other hosts (it then runs no users itself), or
    ``--processes`` on this machine (none for a single process), whose master listens on
    127.0.0.1 on a free port: Locust's default is port 5557 on every interface, a port
    without authentication that a second run on the same machine could not bind."""
    if args.remote_workers:
        return ["--master", "--master-bind-host", args.master_bind, "--master-bind-port", str(args.master_port),
                "--expect-workers", str(args.remote_workers), "--expect-workers-max-wait", "60"]
    if args.processes == 1:
        return []
    port = str(free_local_port())  # the forked workers read --master-port
    return ["--processes", str(args.processes), "--master-bind-host", "127.0.0.1", "--master-bind-port", port,
            "--master-port", port]


def run_locust(args, config, directory, label="", on_warm=None):
    """Run Locust headless into ``directory``; print progress every 5 s; return its exit code.

    Traffic goes to ``config["frontend_url"]``; progress counts come from
    ``config["stats_url"]``; ``label`` prefixes the progress lines. Locust runs
    ``args.warmup + args.duration`` seconds; ``on_warm()`` is called once when the
    locustfile says its warm-up is over (its ``--warm-mark`` file appears), so that the
    caller's counters start at the same moment as Locust's per-server statistics.
    """
    mark = os.path.join(directory, "warm.mark")
    if os.path.exists(mark):
        os.unlink(mark)
    run_time = int(round(args.warmup + args.duration))
    cmd = [
        sys.executable, "-m", "locust", "-f", os.path.join(HERE, "locustfile.py"),
        "--headless", "--only-summary",
        "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
        "--run-time", f"{run_time}s", "--stop-timeout", "10",
        "--warmup", str(args.warmup), "--warm-mark", mark, "--window", str(args.window),
    ] + locust_generator_args(args) + [
        "--host", config["frontend_url"],
        "--weights", args.weights,
        # Locust runs in the report folder: the checkout's file by its absolute path.
        "--editor-password-file", EDITOR_PASSWORD_FILE,
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
            warm = False
            while child.poll() is None:
                # Poll the mark often: every 10 ms of lag shifts requests across the boundary.
                time.sleep(0.2 if warm else 0.01)
                if not warm and os.path.exists(mark):
                    warm = True
                    if on_warm is not None:
                        on_warm()
                    print(f"  {label}warm-up of {args.warmup:g} s over: measuring from now", flush=True)
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
                    print(f"  {label}{min(elapsed, run_time):5.0f}/{run_time} s  requests: {counts}",
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


def measure(args, config, directory, label="", balancer=None, extra_procs=None):
    """One Locust run through ``config["frontend_url"]``, measured and reported into ``directory``.

    Reads HAProxy's stats (``config["stats_url"]``) and CPU times before and after; ``balancer``
    (a psutil.Process) is a temporary HAProxy whose CPU counts as the stack's, and so do
    ``extra_procs`` (``{name: psutil.Process}``, e.g. the A/B slot clients). Every figure
    (HAProxy counters, CPU, Locust's per-server statistics) covers the time after
    ``args.warmup`` seconds. Returns ``(measurement, Locust exit code)``, or ``None``
    (message printed) when Locust did not produce its results. ``measurement`` is the
    plain dict ``loadtests.ab.report.build`` reads: ``{"meta": run facts and CPU
    accounting (seconds), "haproxy": {server: stats counter deltas}, "per_server": the
    locustfile's per_server.json, "server_kinds": {server: WSGI server}}``.
    """
    procs = stack_pids(config)
    procs.update(extra_procs or {})
    if balancer is not None:
        procs["balancer"] = balancer
    started = datetime.now(timezone.utc)
    snap = {}

    def snapshot():
        # Every figure starts here, at the end of the warm-up, not at Locust's start.
        # HAProxy first: Locust's counters started at the mark, every ms here counts.
        snap.update(haproxy=haproxy_stats.fetch(config["stats_url"]), wall=time.monotonic(),
                    cpu=cpu_seconds(procs), busy=machine_busy_seconds(), own=locust_cpu_seconds())

    if args.warmup <= 0:
        snapshot()
    code = run_locust(args, config, directory, label, on_warm=None if snap else snapshot)
    if not snap:
        print(f"abtest: Locust ended before its warm-up of {args.warmup} s was over; see "
              f"{directory}/locust.log", file=sys.stderr)
        return None
    after = haproxy_stats.fetch(config["stats_url"])
    wall = time.monotonic() - snap["wall"]
    cpu_after, busy_after = cpu_seconds(procs), machine_busy_seconds()
    own = locust_cpu_seconds() - snap["own"]
    before, cpu_before, busy_before = snap["haproxy"], snap["cpu"], snap["busy"]

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
    # With remote workers only the master runs here: the cores its one process can use.
    processes = 1 if args.remote_workers else cores if args.processes == -1 else args.processes
    warnings = saturation_warnings(own / wall, busy / (wall * cores), cores, processes)
    if per_server.get("missing_final_reports"):
        # The locustfile's master waited for every worker's last report and one did not
        # come: Locust's per-server counts then miss that worker's last requests.
        warnings.append(f"{per_server['missing_final_reports']} Locust worker(s) sent no last stats report: "
                        "Locust's counts miss their last requests (HAProxy's do not)")
    for text in warnings:
        print(f"  {label}warning: {text}", flush=True)

    meta = {
        "started": started.isoformat(timespec="seconds"),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "warmup_requests": per_server.get("warmup_requests", {}),
        "wall_s": round(wall, 1),
        "warnings": warnings,
        "users": args.users,
        "spawn_rate": args.spawn_rate,
        "weights": args.weights,
        "host": config["frontend_url"],
        "balance": config.get("balance"),
        "locust_version": importlib.metadata.version("locust"),
        "locust_exit_code": code,
        "locust_processes": args.processes,
        # Workers on other hosts: their CPU is not in "cpu" below (only the master's is).
        "remote_workers": args.remote_workers,
        "cpu": {
            "cores": cores,
            "machine_busy_s": round(busy, 2),
            "stack_cpu_s": {n: round(v, 2) for n, v in stack_cpu.items()},
            "load_generator_cpu_s": round(own, 2),
            # cores busy on average; each Locust process can use one at most
            "load_generator_cores": round(own / wall, 2),
            "machine_busy_percent": round(100.0 * busy / (wall * cores), 1),
            # Everything else the machine did meanwhile: other users' processes.
            "foreign_cpu_s": round(foreign, 2),
            "foreign_percent": round(100.0 * foreign / (wall * cores), 1),
        },
    }
    measurement = {
        "meta": meta,
        "haproxy": haproxy_stats.deltas(before, after, config["backend"]),
        "per_server": per_server,
        "server_kinds": {name: config["server_kinds"][name] for name in config["servers"]},
    }
    return measurement, code
