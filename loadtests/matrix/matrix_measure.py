"""One measured run of the benchmark matrix: wrk (or Locust's logged-in shape) against one
server, with psutil around it.

:func:`measure` runs wrk (Debian's, ``loadtests/wrk_summary.lua`` for a one-line JSON
summary) with a fixed number of connections for a fixed time, samples the RSS of the
server's process tree every 0.2 s in a thread, and reads CPU times before and after: of
the server's tree, of wrk, of our own processes (this script, the stack, the other matrix
servers) and of the whole machine. What the machine did beyond ours is *foreign* CPU:
other users of the shared machine. :func:`measure_logged_in` does the same around one Locust
run of the logged-in shape, counting from the end of its warm-up.
"""
import time

import psutil

from loadtests.core.locustrun import run_locust_shape
from loadtests.core.procs import RssSampler, cpu_seconds, machine_busy_seconds, own_cpu_seconds, tree_cpu_seconds
from loadtests.core.stack import PATHS
from loadtests.core.wrk import run_wrk
from loadtests.loggedin import LOGGED_IN

#: wrk's path labels of the matrix: the four of loadtests.connections.connections plus the hello-world app.
MATRIX_PATHS = dict(PATHS, hello=("/", ""))
#: Every path label of the matrix: wrk's, then the opt-in path class of Locust's logged-in
#: shape (:func:`measure_logged_in`), which needs the site's editors.
ALL_PATHS = list(MATRIX_PATHS) + [LOGGED_IN]
#: Seconds of each logged-in run's uncounted start, which holds its editors' logins (the
#: headline's figure, loadtests.core.locustrun).
LOGIN_WARMUP_S = 3.0


class _Meter:
    """The server's CPU and RSS, our own CPU and the machine's between :meth:`start` and
    :meth:`stop` (psutil; the RSS sampled every 0.2 s in a thread)."""

    def __init__(self, server_pids, own_pids):
        self.server_pids = server_pids
        self.own = {pid: p for pid in own_pids for p in [_safe_process(pid)] if p is not None}
        self.sampler = None

    def start(self, child_pid=None):
        """Start counting; ``child_pid``: a child of ours still running (Locust), whose CPU so
        far is not counted (when it is reaped, all of its CPU lands in our children's)."""
        self.sampler = RssSampler(self.server_pids)
        self.server0, self.own0 = tree_cpu_seconds(self.server_pids), sum(cpu_seconds(self.own).values())
        self.me0 = own_cpu_seconds() + (cpu_seconds(_child(child_pid)).get(child_pid, 0.0) if child_pid else 0.0)
        self.busy0, self.t0 = machine_busy_seconds(), time.monotonic()
        self.sampler.start()

    def stop(self):
        """Stop counting; the record's ``cpu_s``, ``peak_rss_bytes``, ``foreign_cpu_s``,
        ``foreign_pct``, ``wall_s`` (see :func:`measure`)."""
        self.sampler.stop()
        wall = time.monotonic() - self.t0
        busy = machine_busy_seconds() - self.busy0
        server_cpu = tree_cpu_seconds(self.server_pids) - self.server0
        ours = server_cpu + (sum(cpu_seconds(self.own).values()) - self.own0) + (own_cpu_seconds() - self.me0)
        foreign = max(busy - ours, 0.0)
        return {
            "cpu_s": round(server_cpu, 3),
            "peak_rss_bytes": self.sampler.peak,
            "foreign_cpu_s": round(foreign, 2),
            "foreign_pct": round(100 * foreign / (wall * (psutil.cpu_count() or 1)), 1) if wall else 0.0,
            "wall_s": round(wall, 2),
        }


def measure(wrk, base_url, path_label, connections, duration, timeout, server_pids, own_pids,
            wrk_threads=None):
    """Run wrk once against ``base_url`` + the path of ``path_label``; return a record dict.

    ``connections``: wrk ``-c``; ``duration``: wrk ``-d`` (seconds); ``timeout``: wrk
    ``--timeout`` (seconds; slower responses count as timeout errors); ``server_pids``: the
    root PIDs of the server's process groups (one ZEO client, or a balanced cell's clients
    and its HAProxy: their CPU and RSS are summed as the server's); ``own_pids``: PIDs of our other processes (the
    stack, the other matrix servers) whose CPU is not foreign. wrk threads: 1 up to 10
    connections, else 2 (``wrk_threads`` overrides).

    Record keys: ``requests``, ``rps`` (requests/s), ``p50_ms``/``p95_ms``/``p99_ms``/
    ``max_ms`` (ms), ``errors`` (``{connect, read, write, timeout}`` socket errors),
    ``non_2xx`` (wrk's non-2xx/3xx count), ``cpu_s`` (server tree CPU seconds),
    ``cpu_ms_per_req``, ``peak_rss_bytes``, ``foreign_cpu_s`` and ``foreign_pct`` (% of
    all cores during the run), ``wall_s``. Raises RuntimeError when wrk fails.
    """
    path, accept = MATRIX_PATHS[path_label]
    threads = wrk_threads or (1 if connections <= 10 else 2)
    threads = min(threads, connections)
    meter = _Meter(server_pids, own_pids)
    meter.start()
    try:
        summary = run_wrk(base_url + path, connections, duration, threads=threads, timeout=timeout, accept=accept,
                          wrk=wrk)
    finally:
        figures = meter.stop()
    seconds = summary["duration_us"] / 1e6
    lat = summary["latency_us"]
    errors = summary["errors"]
    requests = summary["requests"]
    return {
        "requests": requests,
        "rps": round(requests / seconds, 1) if seconds else 0.0,
        "p50_ms": lat["p50"] / 1000, "p95_ms": lat["p95"] / 1000,
        "p99_ms": lat["p99"] / 1000, "max_ms": lat["max"] / 1000,
        "errors": {k: errors[k] for k in ("connect", "read", "write", "timeout")},
        "non_2xx": errors["status"],
        **figures, "cpu_ms_per_req": _per_request(figures["cpu_s"], requests),
        "wrk_threads": threads,
    }


def measure_logged_in(base_url, editors, duration, server_pids, own_pids, warmup=LOGIN_WARMUP_S):
    """One run of the path class ``logged-in``: the locustfile's logged-in shape
    (:func:`loadtests.core.locustrun.run_locust_shape`) with ``editors`` editors against
    ``base_url`` for ``duration`` seconds after a ``warmup`` of seconds that holds their
    logins and is not counted: neither its requests nor the servers' CPU (counting starts when
    Locust writes its warm-up mark). Arguments and record as :func:`measure`, but ``requests``
    and ``rps`` count the editors' front page, folder contents, edit form and save together,
    ``errors`` are all zero (Locust has no socket-error counts of its own) and ``non_2xx``
    counts Locust's failures: a status other than 200 or a body that failed its check,
    connection errors included; ``wrk_threads`` is None. Raises RuntimeError when Locust
    fails or ends before its warm-up is over."""
    meter = _Meter(server_pids, own_pids)
    try:
        row = run_locust_shape(base_url, f"{LOGGED_IN}=1", editors, duration, warmup=warmup, on_warm=meter.start)
    finally:
        if meter.sampler is not None:
            figures = meter.stop()
    return {
        "requests": row["requests"], "rps": row["rps"],
        **{key: row[key] for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms")},
        "errors": {k: 0 for k in ("connect", "read", "write", "timeout")},
        "non_2xx": row["errors"],
        **figures, "cpu_ms_per_req": _per_request(figures["cpu_s"], row["requests"]),
        "wrk_threads": None,
    }


def _per_request(cpu_s, requests):
    """Milliseconds of CPU per request (None without requests)."""
    return round(1000 * cpu_s / requests, 3) if requests else None


def _child(pid):
    process = _safe_process(pid)
    return {pid: process} if process else {}


def _safe_process(pid):
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
