"""One measured run of the benchmark matrix: wrk against one server, with psutil around it.

:func:`measure` runs wrk (Debian's, ``loadtests/wrk_summary.lua`` for a one-line JSON
summary) with a fixed number of connections for a fixed time, samples the RSS of the
server's process tree every 0.2 s in a thread, and reads CPU times before and after: of
the server's tree, of wrk, of our own processes (this script, the stack, the other matrix
servers) and of the whole machine. What the machine did beyond ours is *foreign* CPU:
other users of the shared machine.
"""
import time

import psutil

from loadtests.core.procs import RssSampler, cpu_seconds, machine_busy_seconds, own_cpu_seconds, tree_cpu_seconds
from loadtests.core.stack import PATHS
from loadtests.core.wrk import run_wrk

#: path labels of the matrix: the four of loadtests.connections.connections plus the hello-world app.
MATRIX_PATHS = dict(PATHS, hello=("/", ""))


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
    own = {pid: p for pid in own_pids for p in [_safe_process(pid)] if p is not None}
    sampler = RssSampler(server_pids)
    server0, own0 = tree_cpu_seconds(server_pids), sum(cpu_seconds(own).values())
    me0 = own_cpu_seconds()
    busy0, t0 = machine_busy_seconds(), time.monotonic()
    sampler.start()
    try:
        summary = run_wrk(base_url + path, connections, duration, threads=threads, timeout=timeout, accept=accept,
                          wrk=wrk)
    finally:
        sampler.stop()
    wall = time.monotonic() - t0
    busy = machine_busy_seconds() - busy0
    server_cpu = tree_cpu_seconds(server_pids) - server0
    ours = server_cpu + (sum(cpu_seconds(own).values()) - own0) + (own_cpu_seconds() - me0)
    foreign = max(busy - ours, 0.0)
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
        "cpu_s": round(server_cpu, 3),
        "cpu_ms_per_req": round(1000 * server_cpu / requests, 3) if requests else None,
        "peak_rss_bytes": sampler.peak,
        "foreign_cpu_s": round(foreign, 2),
        "foreign_pct": round(100 * foreign / (wall * (psutil.cpu_count() or 1)), 1) if wall else 0.0,
        "wall_s": round(wall, 2),
        "wrk_threads": threads,
    }


def _safe_process(pid):
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
