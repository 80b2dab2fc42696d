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
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from urllib.parse import urlsplit

import psutil

from loadtests import abslots, abstats, balancers, haproxy_stats, modes_report, report
from loadtests.core import (add_buildout_config_argument, add_run_arguments, add_stack_arguments,
                            check_servers_up, cpu_seconds, default_buildout_config, exits_2_when_not_ready,
                            free_local_port, load_stack, machine_busy_seconds, markdown_table, new_parser,
                            own_cpu_seconds, stack_pids, write_report)
from loadtests.weights import DEFAULT_WEIGHTS, parse_weights

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


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


def parse_args(argv):
    parser = new_parser("ab", "A/B load test of the ZEO clients behind HAProxy; writes var/reports/<timestamp>/.")
    parser.add_argument("--users", type=int, default=10,
                        help="concurrent Locust users (closed loop, no think time); default 10")
    parser.add_argument("--spawn-rate", type=float, default=10.0,
                        help="users started per second; default 10")
    add_run_arguments(parser, duration=60, warmup=10.0, warmup_help=(
        "seconds of traffic at the start of every run (round and kind) left out of every figure "
        "(caches, ZODB connections, HAProxy's first picks)"))
    parser.add_argument("--processes", type=int, default=-1,
                        help="Locust processes on this machine (Locust's --processes: a master and that "
                        "many workers; -1: one per core; 1: a single process, no master); default -1")
    parser.add_argument("--remote-workers", type=int, default=0, metavar="N",
                        help="run Locust as a master on this host that waits for N workers on other "
                        "hosts (the Ansible loadgenerator role starts them) and sends no traffic itself; "
                        "needs --master-bind; default 0 (Locust's processes on this machine, --processes)")
    parser.add_argument("--master-bind", default=None, metavar="ADDRESS",
                        help="address the Locust master listens on for --remote-workers (the address "
                        "the load generator hosts reach this host at, loadgenerator_master_host)")
    parser.add_argument("--master-port", type=int, default=5557,
                        help="TCP port of the Locust master for --remote-workers "
                        "(loadgenerator_master_port); default 5557, Locust's own")
    parser.add_argument("--window", type=float, default=5.0,
                        help="seconds per time window, the unit the confidence intervals resample; default 5")
    parser.add_argument("--weights", default=DEFAULT_WEIGHTS,
                        help=f"users per traffic shape (root, plone, json, blob); default {DEFAULT_WEIGHTS}")
    add_stack_arguments(parser)
    parser.add_argument("--balance", default=None,
                        help="comma-separated HAProxy balance modes to compare, each through its own "
                        f"temporary HAProxy; allowed: {', '.join(balancers.MODES)}; default: the "
                        "deployed HAProxy's mode only, through the deployed HAProxy (the plain A/B run)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="A/B rounds; odd rounds run pyruvate in slot a (first in HAProxy's list, "
                        "lower port) and waitress in slot b, even rounds the other way round; default 4. "
                        "With --balance: runs per mode, modes interleaved in each round; default 1 "
                        "(--duration is per mode and round)")
    parser.add_argument("--control", action="store_true",
                        help="also run every round as A/A (both slots on --control-server): its split is "
                        "the noise floor of the verdict")
    parser.add_argument("--control-server", choices=abslots.SERVERS, default=abslots.SERVERS[0],
                        help=f"the WSGI server of both slots in the A/A control; default {abslots.SERVERS[0]}")
    parser.add_argument("--calibrate", type=float, default=None, metavar="PERCENT",
                        help="instead of the A/B, run A/A rounds (both on --control-server) with slot A "
                        "frozen (SIGSTOP) PERCENT of every 100 ms: a known difference the verdict must "
                        "detect (sensitivity check)")
    parser.add_argument("--slot-port", type=int, default=None,
                        help="127.0.0.1 port of slot a; slot b uses the next one; default the deployed "
                        "frontend port + 12")
    parser.add_argument("--deployed", action="store_true",
                        help="one run through the deployed HAProxy and clients (instance: pyruvate, "
                        "client2: waitress) instead of rounds; server and slot are then confounded")
    add_buildout_config_argument(parser, "the slots' buildout var/abslots/buildout.cfg")
    parser.add_argument("--balancer-port", type=int, default=None,
                        help="with --balance: 127.0.0.1 port of the temporary HAProxy's frontend, its "
                        "stats on the next port; default the deployed frontend port + 10")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if (args.balance or args.deployed) else 4
    if args.users < 1 or args.duration < 1 or args.spawn_rate <= 0 or args.rounds < 1:
        parser.error("--users, --duration and --rounds must be >= 1 and --spawn-rate > 0")
    if args.warmup < 0 or args.window <= 0:
        parser.error("--warmup must be >= 0 and --window > 0 seconds")
    if args.remote_workers < 0 or bool(args.remote_workers) != bool(args.master_bind):
        parser.error("--remote-workers N (>= 1) and --master-bind ADDRESS go together")
    if args.master_bind in ("0.0.0.0", "*", "::", "[::]"):
        parser.error(f"--master-bind {args.master_bind}: Locust's master port has no authentication; "
                     "give the control host's private address (loadgenerator_master_host)")
    if args.remote_workers and not args.deployed:
        parser.error("--remote-workers needs --deployed: the rounds' temporary HAProxys listen on "
                     "127.0.0.1, which other hosts cannot reach")
    if not 1 <= args.master_port <= 65535:
        parser.error("--master-port must be between 1 and 65535")
    if args.calibrate is not None and not 0 < args.calibrate < 100:
        parser.error("--calibrate PERCENT must be between 0 and 100")
    if args.buildout_config is None:
        args.buildout_config = default_buildout_config()
    # Locust runs in the report folder: a relative --out would point inside it.
    args.out = os.path.abspath(args.out)
    if args.balancer_port is not None and not 1 <= args.balancer_port <= 65534:
        parser.error("--balancer-port must be between 1 and 65534 (the stats use the next port)")
    try:
        parse_weights(args.weights)
        if args.balance is not None:
            args.balance = balancers.parse_modes(args.balance)
    except ValueError as exc:
        parser.error(str(exc))
    return args


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
    ``args.warmup`` seconds. Returns
    ``(report dict, Locust exit code, per-server JSON)``, or ``None`` (message printed) when
    Locust did not produce its results.
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
    data = report.build(
        meta,
        haproxy_stats.deltas(before, after, config["backend"]),
        per_server,
        {name: config["server_kinds"][name] for name in config["servers"]},
    )
    return data, code, per_server


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


def can_vary(config):
    """True when ``config`` describes the deployed HAProxy well enough to run variants of
    it (``haproxy_context`` of a buildout's stack.json); the Ansible role's ``abtest.json``
    describes only the frontend and stats URLs."""
    return bool(config.get("haproxy_context") and config.get("haproxy_template"))


def run_modes(args, config, directory, modes):
    """One run per mode and round, each through its own temporary HAProxy; returns the exit status.

    Rounds interleave the modes (round 1: all modes, round 2: all modes, ...) so that
    machine noise hits every mode alike. Each run's full single-mode report goes to
    ``<directory>/<mode>-r<round>/``; the per-mode report to ``<directory>/``.
    """
    binary = config["haproxy_binary"]
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
            balancer = balancers.TemporaryBalancer(binary, config, mode, run_dir, args.balancer_port)
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


class Freezer:
    """Slow one client by a known amount: SIGSTOP its process group for ``percent`` % of
    every ``period`` seconds, SIGCONT for the rest, in a background thread (calibration).

    A frozen Zope finishes nothing, so its capacity falls by ``percent`` %; requests HAProxy
    already sent it wait. Use as a context manager; on exit the group is always continued.
    """

    def __init__(self, pgid, percent, period=0.1):
        import threading

        self.pgid, self.stop_s, self.period = pgid, period * percent / 100.0, period
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.done.is_set():
            try:
                os.killpg(self.pgid, signal.SIGSTOP)
                time.sleep(self.stop_s)
            finally:
                os.killpg(self.pgid, signal.SIGCONT)
            self.done.wait(self.period - self.stop_s)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        os.killpg(self.pgid, signal.SIGCONT)
        return False


def round_plan(args):
    """The runs of a rounds invocation, in order: ``[(round, kind, server of slot a, server
    of slot b, slot holding role A)]``. Role A is the first of ``abslots.SERVERS``
    (pyruvate): in slot a in odd rounds, in slot b in even ones, so that position effects
    cancel over an even number of rounds. ``kind`` is "ab" (or, with --calibrate, both
    slots on the control server with A frozen) and "aa" with --control."""
    first, second = abslots.SERVERS
    same = args.control_server
    plan = []
    for round_no in range(1, args.rounds + 1):
        slot_a = "a" if round_no % 2 else "b"
        if args.calibrate is not None:
            runs = [("ab", same, same)]
        else:
            runs = [("ab", first, second) if slot_a == "a" else ("ab", second, first)]
        if args.control:
            runs.append(("aa", same, same))
        if round_no % 2 == 0:
            runs.reverse()  # A/A and A/B take turns at going first within a round, too
        plan += [(round_no, kind, a, b, slot_a) for kind, a, b in runs]
    return plan


def run_rounds(args, config, directory):
    """Rounds with swapped slots (and A/A control runs); returns the exit status.

    Builds the slot clients once (``loadtests.abslots``), then per run starts the pair it
    needs (stopping the one it replaces), a temporary HAProxy with the pair in slot order
    (``loadtests.balancers``, the deployed balance mode), measures, and stops that HAProxy.
    Writes each run's single report into ``<directory>/<kind>-r<round>/`` and the verdict
    report (``loadtests.abstats``) into ``<directory>/``.
    """
    binary, haproxy_name = config["haproxy_binary"], config["haproxy_context"]["part"]
    frontend_port = urlsplit(config["frontend_url"]).port
    if args.balancer_port is None:
        args.balancer_port = frontend_port + 10
    if args.slot_port is None:
        args.slot_port = frontend_port + 12
    ports = {"a": args.slot_port, "b": args.slot_port + 1}
    plan = round_plan(args)
    per_run = args.warmup + args.duration
    print(f"A/B in {args.rounds} round(s) with swapped slots: {len(plan)} runs of {args.warmup:g} s warm-up + "
          f"{args.duration} s measured (about {len(plan) * per_run / 60:.1f} min of load plus client "
          f"restarts), {args.users} users, weights {args.weights}; slots a :{ports['a']} (first in HAProxy's "
          f"list) and b :{ports['b']}; temporary HAProxy :{args.balancer_port}"
          + (f"; A/A control on {args.control_server}" if args.control else "")
          + (f"; calibration: A frozen {args.calibrate:g}% of the time" if args.calibrate is not None else ""),
          flush=True)
    took = abslots.build(args.buildout_config, config["servers"][0], haproxy_name, config["part"], ports)
    print(f"slot buildout {abslots.WORK_DIR}/buildout.cfg: {took:.0f} s", flush=True)
    runs, worst = [], 0
    with abslots.Slots(ports, config["log_dir"]) as slots:
        for round_no, kind, server_a, server_b, slot_a in plan:
            label = f"[{kind} r{round_no}/{args.rounds}: a={server_a} b={server_b}] "
            name = f"{kind}-r{round_no}"
            run_dir = os.path.join(directory, name)
            os.makedirs(run_dir, exist_ok=True)
            restart_s = slots.ensure(server_a, server_b)
            names = {"a": abslots.part("a", server_a), "b": abslots.part("b", server_b)}
            roles = {"A": names[slot_a], "B": names["b" if slot_a == "a" else "a"]}
            kinds = {names["a"]: server_a, names["b"]: server_b}
            balancer = balancers.TemporaryBalancer(binary, abslots.pair_config(server_a, server_b),
                                                   config.get("balance", "leastconn"), run_dir,
                                                   args.balancer_port)
            pids = slots.pids()
            with balancer:
                try:
                    balancer.start(config["backend"], list(names.values()))
                except balancers.BalancerError as exc:
                    print(f"abtest: {exc}", file=sys.stderr)
                    return 2
                run_config = dict(config, frontend_url=balancer.frontend_url, stats_url=balancer.stats_url,
                                  servers=list(names.values()), server_kinds=kinds)
                extra = {n: psutil.Process(pid) for n, pid in pids.items() if pid}
                if kind == "ab" and args.calibrate is not None:
                    with Freezer(pids[roles["A"]], args.calibrate):
                        result = measure(args, run_config, run_dir, label, balancer.process, extra)
                else:
                    result = measure(args, run_config, run_dir, label, balancer.process, extra)
            if result is None:
                return 2
            data, code, per_server = result
            report.write(data, run_dir)
            with open(os.path.join(run_dir, "warm.mark"), encoding="utf-8") as fp:
                warm_epoch = float(fp.read())
            # The log is complete now that this HAProxy has stopped.
            server_windows = abstats.server_time_windows(balancer.log_path, config["backend"], warm_epoch,
                                                         args.window)
            counts = {role: data["servers"].get(n, {}).get("requests", 0) for role, n in roles.items()}
            share = counts["A"] / max(sum(counts.values()), 1)
            print(f"{label}{data['totals']['requests']} requests, {data['totals']['failures']} failures, "
                  f"{data['totals']['rps']:.1f} req/s; A ({roles['A']}) {100 * share:.1f}%; Locust "
                  f"{data['meta']['cpu']['load_generator_cores']} cores, machine "
                  f"{data['meta']['cpu']['machine_busy_percent']}% busy, foreign "
                  f"{data['meta']['cpu']['foreign_percent']}%; clients (re)started in {restart_s:.0f} s",
                  flush=True)
            worst = max(worst, 0 if data["totals"]["failures"] == 0 and code == 0 else 1)
            runs.append({"kind": kind, "round": round_no, "directory": name, "slots": {"a": server_a, "b": server_b},
                         "slot_names": names, "labels": roles, "windows": per_server.get("windows", []),
                         "server_time_windows": server_windows,
                         "totals": data["totals"], "cpu": data["meta"]["cpu"], "warnings": data["meta"]["warnings"],
                         "warmup_requests": data["meta"]["warmup_requests"], "restart_s": round(restart_s, 1)})
    first, second = abslots.SERVERS
    name_a = (f"{args.control_server} frozen {args.calibrate:g}%" if args.calibrate is not None else first)
    name_b = args.control_server if args.calibrate is not None else second
    meta = {
        "started": os.path.basename(directory), "rounds": args.rounds, "runs": len(runs),
        "duration_s": args.duration, "warmup_s": args.warmup, "window_s": args.window,
        "users": args.users, "spawn_rate": args.spawn_rate, "weights": args.weights,
        "balance": config.get("balance"), "control": args.control, "control_server": args.control_server,
        "calibrate_percent": args.calibrate, "name_a": name_a, "name_b": name_b,
        "slot_ports": ports, "balancer_url": f"http://127.0.0.1:{args.balancer_port}",
        "locust_version": importlib.metadata.version("locust"), "scipy_version": importlib.metadata.version("scipy"),
        "cores": psutil.cpu_count() or 1, "load_average_start": os.getloadavg(),
    }
    data = rounds_report(meta, runs)
    md_path, png_path = write_rounds_report(data, directory)
    print()
    for line in data["verdicts"]:
        print(line["text"])
    for text in data["warnings"]:
        print(f"warning: {text}")
    print()
    print(f"report: {md_path}")
    print(f"plot:   {png_path}")
    return worst


def rounds_report(meta, runs):
    """The report dict of a rounds invocation: ``{"meta", "runs", "stats": {"ab", "aa"},
    "slot_share", "verdicts": [{"path", "detected", "text"}], "warnings"}`` (shares as
    fractions 0..1; see loadtests.abstats)."""
    ab = abstats.summarize(runs, "ab")
    aa = abstats.summarize(runs, "aa") if meta["control"] else None
    verdicts = []
    # Every path of the locustfile, also one the A/B run finished none of (a 6 s run on a
    # busy machine can miss /Plone): the report says "no requests" instead of leaving it out.
    for path in dict.fromkeys(abstats.PATHS + tuple(ab)):
        detected, text = abstats.verdict(path, ab, aa, meta["name_a"])
        verdicts.append({"path": path, "detected": detected, "text": text})
    # The same statistics over HAProxy's log: request counts and the servers' own time (Tr).
    by_log = [dict(run, windows=run["server_time_windows"]) for run in runs]
    log_paths = tuple(abstats.LOG_PATHS.values()) + ("all",)
    server_time = {"ab": abstats.summarize(by_log, "ab", log_paths),
                   "aa": abstats.summarize(by_log, "aa", log_paths) if meta["control"] else None}
    # No server-time ratio of all paths pooled: its p50 depends on the mix of paths each
    # server got in a window (the one that got more of the fast "/" looks faster), so even
    # the A/A control's interval could miss 1 (1.05-2.05 in a 2-round demo). Its request
    # counts stay, as the check of Locust's.
    for summary in server_time.values():
        if summary and "all" in summary:
            summary["all"].update(p50_ratio=None, p99_ratio=None)
    for path in abstats.LOG_PATHS.values():
        detected, text = abstats.time_verdict(path, server_time["ab"], server_time["aa"], meta["name_a"],
                                              meta["name_b"])
        verdicts.append({"path": path, "detected": detected, "text": text, "measure": "server time"})
    warnings = sorted({w for run in runs for w in run["warnings"]})
    return {"meta": meta, "runs": runs, "stats": {"ab": ab, "aa": aa}, "server_time": server_time,
            "slot_share": abstats.slot_share(runs), "verdicts": verdicts, "warnings": warnings}


def write_rounds_report(data, directory):
    """Write ``report.json``, ``report.md`` and ``ab.png`` of a rounds invocation; return the
    paths of the last two."""
    meta = data["meta"]
    summaries = {f"A/B: A = {meta['name_a']}, B = {meta['name_b']}": data["stats"]["ab"]}
    if data["stats"]["aa"]:
        summaries[f"A/A control: both {meta['control_server']}"] = data["stats"]["aa"]
    title = (f"A/B in {meta['rounds']} rounds x {meta['duration_s']} s, {meta['users']} users, "
             f"{meta['started']}")
    _, md_path, png_path = write_report(directory, data, rounds_markdown(data), [
        ("ab.png", lambda path: abstats.plot(summaries, path, title))])
    return md_path, png_path


def rounds_markdown(data):
    """report.md of a rounds invocation (``data`` as built by ``rounds_report``), a str."""
    meta = data["meta"]
    slot = data["slot_share"]
    lines = [
        f"# A/B report {meta['started']}",
        "",
        f"{meta['rounds']} rounds, {meta['runs']} runs of {meta['warmup_s']:g} s warm-up (left out of every "
        f"figure) + {meta['duration_s']} s measured, cut into {meta['window_s']:g} s windows; "
        f"{meta['users']} Locust {meta['locust_version']} users (weights {meta['weights']}), HAProxy "
        f"{meta['balance']} through a temporary HAProxy in front of two slots: a (:{meta['slot_ports']['a']}, "
        f"first in the server list) and b (:{meta['slot_ports']['b']}). A = {meta['name_a']}, "
        f"B = {meta['name_b']}; A sits in slot a in odd rounds and in slot b in even ones. "
        f"Machine: {meta['cores']} cores, load average at the start {meta['load_average_start'][0]:.2f}.",
        "",
        "## Verdict",
        "",
    ]
    lines += [f"- {v['text']}" for v in data["verdicts"]]
    if slot:
        lines += ["", f"Position check: slot a (first in HAProxy's list) finished {100 * slot['value']:.1f}% "
                  f"(95% CI {100 * slot['low']:.1f}–{100 * slot['high']:.1f}%) of the A/B requests."]
    if data["warnings"]:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in data["warnings"]]
    lines += ["", "## A/B: share, req/s and latency ratios (95% bootstrap intervals over rounds x windows)", "",
              abstats.table(data["stats"]["ab"]), ""]
    if data["stats"]["aa"]:
        lines += [f"## A/A control (both slots on {meta['control_server']}): the noise floor", "",
                  abstats.table(data["stats"]["aa"]), ""]
    lines += ["## The servers' own time (HAProxy's log)", "",
              "From the temporary HAProxy's log of each run, after the warm-up: the share column "
              "counts HAProxy's requests (a check of Locust's); the p50/p99 ratios are of `Tr`, the "
              "time from sending the request to the server until its response headers arrived: "
              "without the wait in HAProxy's queue and without the body's transfer to Locust, "
              "which set the pace of the share on this machine (docs/usage.md, Sensitivity). "
              "HAProxy logs the URL only, so /Plone as page and as JSON are one row.", "",
              "A/B:", "", abstats.table(data["server_time"]["ab"]), ""]
    if data["server_time"]["aa"]:
        lines += ["A/A:", "", abstats.table(data["server_time"]["aa"]), ""]
    lines += ["## Runs", "", markdown_table(
        ["run", "slot a", "slot b", "requests", "failures", "req/s", "warm-up requests left out",
         "Locust cores", "machine busy %", "foreign %", "report"],
        [[f"{run['kind']} r{run['round']}", run["slots"]["a"], run["slots"]["b"], run["totals"]["requests"],
          run["totals"]["failures"], round(run["totals"]["rps"], 1), sum(run["warmup_requests"].values()),
          run["cpu"]["load_generator_cores"], run["cpu"]["machine_busy_percent"], run["cpu"]["foreign_percent"],
          f"[{run['directory']}]({run['directory']}/report.md)"] for run in data["runs"]])]
    lines += ["", "![A/B with intervals](ab.png)", ""]
    return "\n".join(lines)


@exits_2_when_not_ready("abtest")
def main(argv=None):
    """Entry point; see the module docstring."""
    args = parse_args(argv)
    config = load_stack(args.stack_config)
    check_servers_up(config)
    modes = args.balance or [config.get("balance")]
    deployed_only = modes == [config.get("balance")]
    rounds = deployed_only and not args.deployed and not args.balance
    if rounds and not can_vary(config):
        # The Ansible role's abtest.json describes only URLs: no parts to derive slots from.
        print(f"abtest: {args.stack_config} has no haproxy_context (the deployed HAProxy's template "
              "variables): no slots can be built from it; running once through the deployed HAProxy "
              "(as --deployed)", flush=True)
        rounds = False
    if not deployed_only and not can_vary(config):
        print(f"abtest: --balance needs the deployed HAProxy's template variables (haproxy_context), and "
              f"{args.stack_config} has none (run it with a buildout's parts/stack/stack.json)",
              file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc)
    directory = os.path.join(args.out, started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(directory, exist_ok=True)
    # A SIGTERM (e.g. from a test's timeout) must still stop the temporary HAProxys and
    # slot clients: turn it into SystemExit so that the with-blocks' cleanup runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if rounds:
        return run_rounds(args, config, directory)
    if deployed_only:
        return run_deployed(args, config, directory)
    if args.balancer_port is None:
        args.balancer_port = urlsplit(config["frontend_url"]).port + 10
    return run_modes(args, config, directory, modes)


if __name__ == "__main__":
    sys.exit(main())
