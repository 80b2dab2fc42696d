"""One measurement of the storage benchmark: a wrk run against one variant, after the last
run's requests are done (``wait_requests_done``), with the CPU of client and database.
"""
import re
import secrets
import time

import requests

from loadtests.core.procs import machine_busy_seconds, tree_cpu_seconds, wait_tree_idle
from loadtests.core.stack import BLOB_SIZE, PATHS
from loadtests.core.wrk import WRK_POST_SCRIPT, run_wrk
from loadtests.storage.plan import WRITE, WRITE_FOLDER


# ----------------------------------------------------------------------------- measuring

def wait_requests_done(metrics_url, quiet=1.0, max_seconds=120.0, interval=0.1):
    """Wait until the client's ``zope_http_requests_in_progress`` (its metrics filter) was 0
    in every sample of ``quiet`` seconds, at most ``max_seconds``; returns the seconds waited.

    The write path needs this besides :func:`wait_tree_idle`: a request that hit a
    ConflictError sleeps Zope's retry back-off (up to 1, 2, 4, ... s) in its worker without
    using CPU, so an idle process tree does not mean that the POSTs wrk left queued are done.
    A scrape that fails counts as not quiet."""
    started = time.monotonic()
    zero_since = None
    while time.monotonic() - started < max_seconds:
        try:
            text = requests.get(metrics_url, timeout=5).text
            busy = float(re.search(r"^zope_http_requests_in_progress (\S+)$", text, re.MULTILINE).group(1))
        except (requests.RequestException, AttributeError, ValueError):
            busy = None
        now = time.monotonic()
        if busy == 0:
            zero_since = zero_since or now
            if now - zero_since >= quiet:
                break
        else:
            zero_since = None
        time.sleep(interval)
    return time.monotonic() - started


def measure(variant, label, connections, duration, warmup, number):
    """One run of ``label`` at ``connections`` against ``variant``'s client (after
    ``warmup`` uncounted seconds); returns the row of loadtests.storage.storagebench's docstring."""
    client_pid, database_pid = variant.pid("instance"), variant.pid(variant.database)
    if not client_pid or not database_pid:
        raise RuntimeError(f"{variant.name}: a process is gone (client {client_pid}, database {database_pid})")
    threads = min(2, connections)

    def once(seconds):
        if label == WRITE:
            env = {"PLONEDEPLOY_AUTH": variant.auth_header(),
                   "PLONEDEPLOY_WRITE_PREFIX": f"r{number}-c{connections}-{secrets.token_hex(4)}"}
            return run_wrk(f"{variant.write_url}/Plone/{WRITE_FOLDER}", connections, seconds, threads=threads,
                           script=WRK_POST_SCRIPT, env=env)
        path, accept = PATHS[label]
        return run_wrk(variant.url + path, connections, seconds, threads=threads, accept=accept)

    def settle():
        if label == WRITE:
            wait_requests_done(variant.metrics_url)
        wait_tree_idle(client_pid)

    if warmup:
        once(warmup)
        settle()
    cpu_before = {"client": tree_cpu_seconds(client_pid), "database": tree_cpu_seconds(database_pid)}
    busy_before = machine_busy_seconds()
    out = once(duration)
    busy = machine_busy_seconds() - busy_before
    cpu = {"client": tree_cpu_seconds(client_pid) - cpu_before["client"],
           "database": tree_cpu_seconds(database_pid) - cpu_before["database"]}
    # Requests a server queued keep it busy after wrk stopped: not into the next run.
    settle()
    seconds = out["duration_us"] / 1e6
    done = out["requests"]
    row = {"round": number, "variant": variant.name, "path": label, "connections": connections,
           "requests": done, "rps": round(done / seconds, 1), "mib_s": round(out["bytes"] / seconds / 2**20, 1),
           "p50_ms": round(out["latency_us"]["p50"] / 1000, 1), "p99_ms": round(out["latency_us"]["p99"] / 1000, 1),
           "errors": sum(out["errors"].values()), "error_kinds": {k: v for k, v in out["errors"].items() if v},
           "client_cpu_ms": round(1000 * cpu["client"] / done, 2) if done else None,
           "database_cpu_ms": round(1000 * cpu["database"] / done, 2) if done else None,
           "other_cores": round(max(busy - cpu["client"] - cpu["database"] - out["cpu_s"], 0.0) / out["wall_s"], 2)}
    if label == "blob":
        row["short_bytes"] = out["bytes"] < done * BLOB_SIZE
    return row
