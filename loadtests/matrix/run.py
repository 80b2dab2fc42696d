"""The matrix's runs: ``measure_all`` (builds and starts the servers, measures the runs to do,
stops the servers), ``Targets`` (a cell's ZEO client directly, or a temporary HAProxy over
its replicas) and ``run_loop`` (the runs in order).
"""
import contextlib
import json
import os
import signal
import sys
import time
from datetime import datetime, timezone

import psutil

from loadtests.core import extrabuild, haproxy_stats
from loadtests.core.balancers import BalancerError, TemporaryBalancer
from loadtests.core.procs import raise_fd_limit, wait_tree_idle
from loadtests.core.stack import service_user, zeo_server
from loadtests.core.locustrun import run_locust_shape
from loadtests.core.wrk import run_wrk
from loadtests.loggedin import LOGGED_IN
from loadtests.matrix import matrix_plan, matrix_report, matrix_servers
from loadtests.matrix.matrix_measure import LOGIN_WARMUP_S, MATRIX_PATHS, measure, measure_logged_in
from plonedeploy.stack.rules import ZOPE_HEALTH_CHECK
from plonedeploy.stack.errors import StackError


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def measure_all(args, config, stack, pairs, ports, todo, wrk, results_path, zeo, balancer_port):
    """Build and start the servers (ZEO clients of ``zeo``, the stack's ZEO server's
    ``host:port``), measure the runs of ``todo`` (appending to ``results_path``; balanced
    cells through a temporary HAProxy on ``balancer_port`` and the next), stop the servers.
    Returns 0, 1 (runs failed or interrupted) or 2 (servers could not be built or started)."""
    # Every wrk connection and every server-side socket is a descriptor: raise the soft
    # limit before starting the servers, which inherit it (hard limit here: 20,000).
    soft, _ = raise_fd_limit(2 * max(args.connections) + 512)
    if soft < max(args.connections) + 64:
        print(f"matrix: fd limit {soft} too low for {max(args.connections)} connections", file=sys.stderr)
        return 2
    _, blobs = zeo_server(config)
    t0 = time.monotonic()
    print(f"building {len(pairs)} parts in {args.build} ...", flush=True)
    try:
        matrix_servers.build(args.build, pairs, ports, zeo, blobs, service_user(config))
    except RuntimeError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _interrupt)
    servers = matrix_servers.run_config(args.build, pairs, ports, hello="hello" in args.paths)
    print(f"built in {time.monotonic() - t0:.0f} s; starting {len(servers['processes'])} servers ...", flush=True)
    try:
        procs = matrix_servers.start_all(servers, pairs)
        print(f"  {len(procs)} servers answering ({time.monotonic() - t0:.0f} s)", flush=True)
        # The first request of each path loads its objects and templates (seconds on a
        # busy machine): one per path and client before any timing, so no warm-up starts cold.
        # (logged-in: its warm-up run, a Locust run, primes its pages)
        zope_paths = [MATRIX_PATHS[p] for p in args.paths if p in MATRIX_PATHS and p != "hello"]
        for zope_port, _ in ports.values():
            matrix_servers.prime(f"http://127.0.0.1:{zope_port}", zope_paths)
        print(f"  primed {len(zope_paths)} paths on {len(ports)} clients ({time.monotonic() - t0:.0f} s)",
              flush=True)
        trees = {key: [p.pid for p in matrix_servers.tree(proc)] for key, proc in procs.items()}
        stack_own = [p.pid for p in stack.values()]
        target = Targets(config, ports, procs, os.path.join(os.path.dirname(results_path), "haproxy"), balancer_port)
        return run_loop(args, target, trees, stack_own, todo, wrk, results_path)
    except (RuntimeError, StackError, BalancerError) as exc:
        print(f"matrix: {exc}; logs in {args.build}/log/", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("matrix: interrupted; the runs measured so far are kept", file=sys.stderr)
        return 1
    finally:
        extrabuild.stop(servers)
        signal.signal(signal.SIGTERM, previous)
        print(f"stopped {len(servers['processes'])} servers", flush=True)


class Targets:
    """Where a cell's runs go: its ZEO client (or hello server) directly, or for a cell with
    ``clients`` n >= 1 a temporary HAProxy over replicas 1..n (:meth:`open`).

    ``config``: stack.json (the HAProxy template, binary and backend name); ``ports`` and
    ``procs``: of :mod:`loadtests.matrix.matrix_servers`; ``directory``: the temporary HAProxy's
    config and log; ``balancer_port``: its frontend port (stats: the next), None when no
    cell is balanced."""

    def __init__(self, config, ports, procs, directory, balancer_port):
        self.config, self.ports, self.procs = config, ports, procs
        self.directory, self.balancer_port = directory, balancer_port

    def keys(self, cell):
        """The ``(part, kind)`` keys of the processes serving ``cell``."""
        kind = "hello" if cell.path == "hello" else "zope"
        return [(part, kind) for part in matrix_plan.parts_of(cell)]

    @contextlib.contextmanager
    def open(self, cell):
        """Yield ``(base URL, server PIDs, balancer or None)`` for a run of ``cell``; raises
        RuntimeError when one of its processes exited, BalancerError when the HAProxy
        does not start with every client UP."""
        keys = self.keys(cell)
        for part, kind in keys:
            proc = self.procs[(part, kind)]
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                raise RuntimeError(f"{matrix_servers.part_name(part)} ({kind}) exited")
        pids = [self.procs[key].pid for key in keys]
        if not cell.clients:
            part, kind = keys[0]
            yield f"http://127.0.0.1:{self.ports[part][1 if kind == 'hello' else 0]}", pids, None
            return
        servers = [{"name": matrix_servers.part_name(part), "host": "127.0.0.1", "port": self.ports[part][0],
                    "maxconn": part.threads, "wsgi_server": part.server} for part, _ in keys]
        # The matrix's clients have no metrics address, so no probes: Zope's own check path.
        with TemporaryBalancer(self.config["haproxy_binary"], self.config, "leastconn", self.directory,
                               self.balancer_port, servers=servers, health_check=ZOPE_HEALTH_CHECK) as balancer:
            balancer.start(self.config["backend"], [s["name"] for s in servers], timeout=60)
            yield balancer.frontend_url, pids + [balancer.pid], balancer


def _warm_up(base, cell, args, wrk):
    """Load ``cell``'s path at ``base`` for ``args.warmup`` s at up to 10 connections, not
    counted (wrk; ``logged-in``: a Locust run of up to 10 editors after their logins); returns
    the requests/s it served (0.0 when none)."""
    if cell.path == LOGGED_IN:
        return run_locust_shape(base, f"{LOGGED_IN}=1", min(cell.connections, 10), args.warmup,
                                warmup=LOGIN_WARMUP_S)["rps"]
    path, accept = MATRIX_PATHS[cell.path]
    warm = run_wrk(base + path, min(cell.connections, 10), args.warmup, timeout=args.timeout, accept=accept, wrk=wrk)
    return warm["requests"] / (warm["duration_us"] / 1e6) if warm["duration_us"] else 0.0


def run_loop(args, target, trees, stack_own, todo, wrk, results_path):
    """Measure the runs of ``todo`` in order (each through ``target``, a :class:`Targets`);
    returns 0, or 1 when some run failed."""
    warmed, failed = set(), 0
    rates = {}                       # cell -> requests/s of its warm-up or its last run
    started = time.monotonic()
    for number, (cell, index) in enumerate(todo, start=1):
        keys = target.keys(cell)
        own = stack_own + [pid for k, pids in trees.items() if k not in keys for pid in pids]
        try:
            with target.open(cell) as (base, server_pids, balancer):
                if cell not in warmed and args.warmup:
                    rates[cell] = _warm_up(base, cell, args, wrk)
                warmed.add(cell)
                seconds = matrix_plan.cell_duration(rates.get(cell), cell.connections, args.requests_per_connection,
                                                    args.duration, args.max_duration)
                # the warm-up's (or the server's last run's) abandoned requests
                drain = wait_tree_idle(server_pids, max_seconds=args.drain_max)
                before = haproxy_stats.fetch(balancer.stats_url) if balancer else None
                if cell.path == LOGGED_IN:
                    record = measure_logged_in(base, cell.connections, seconds, server_pids, own)
                else:
                    record = measure(wrk, base, cell.path, cell.connections, seconds, args.timeout, server_pids, own)
                if balancer:
                    sessions = {name: d["stot"] for name, d in haproxy_stats.deltas(
                        before, haproxy_stats.fetch(balancer.stats_url), target.config["backend"]).items()}
                    record["share"] = {name: round(n / (sum(sessions.values()) or 1), 3)
                                       for name, n in sessions.items()}
            rates[cell] = record["rps"]
            record["drain_before_s"] = round(drain, 1)
            record["backlog"] = drain >= args.drain_max
            record["duration_s"] = seconds
            record["steady"] = matrix_plan.steady(record["requests"], cell.connections, args.requests_per_connection)
        except (RuntimeError, BalancerError, OSError) as exc:
            failed += 1
            print(f"  run failed: {tuple(cell)} #{index}: {str(exc)[:500]}", file=sys.stderr, flush=True)
            continue
        record = dict(cell._asdict(), run=index, time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      **record)
        with open(results_path, "a", encoding="utf-8") as fp:
            fp.write(json.dumps(record) + "\n")
            fp.flush()
            os.fsync(fp.fileno())
        elapsed = time.monotonic() - started
        eta = elapsed / number * (len(todo) - number)
        errors = sum(record["errors"].values())
        print(f"[{number}/{len(todo)} ETA {eta / 60:.1f} min] {matrix_report.label(record)} t{cell.threads} "
              f"{cell.path} c{cell.connections} #{index}: "
              f"{record['duration_s']} s, {record['requests'] / cell.connections:.1f} req/conn"
              f"{'' if record['steady'] else ' (not steady)'}, {record['rps']:.1f} req/s, p99 "
              f"{'-' if record['p99_ms'] is None else format(record['p99_ms'], '.1f')} ms, errors {errors}, non-2xx "
              f"{record['non_2xx']}, RSS {record['peak_rss_bytes'] / 2**20:.0f} MiB, foreign "
              f"{record['foreign_pct']:.0f} %", flush=True)
    return 1 if failed else 0
