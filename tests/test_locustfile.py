"""loadtests/locustfile.py with Locust's --processes (a master and workers), against a small
HTTP server of the test's own on an ephemeral 127.0.0.1 port (no stack): the per-server
counts the master writes are those of every worker, their last requests included."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
from http_stub import answering_server
from loadtests.core.procs import free_local_port


@pytest.fixture
def slow_server():
    """A server that answers every GET after 0.8 s, alternately as "a" and "b" in
    X-Served-By (as HAProxy names its server), and counts what it answered per name."""
    counts = {}
    lock = threading.Lock()

    def answer(_request):
        time.sleep(0.8)
        with lock:
            name = "ab"[sum(counts.values()) % 2]
            counts[name] = counts.get(name, 0) + 1
        return 200, {"X-Served-By": name}, b"ok"

    with answering_server(answer, keep_alive=True) as url:
        yield url, counts


def test_master_waits_for_every_workers_last_report(slow_server, tmp_path):
    """Every request takes 0.8 s: when the run time is up, each worker's users finish the
    request they are in (--stop-timeout) before the worker can send its last report, later
    than the 0.5 s Locust's master waits on its own. Without the locustfile's wait for those
    reports, the per-server counts missed up to 3 s of requests (here 4-7 of 10 per server,
    3 runs of 3); with it they equal the server's own counts, as HAProxy's do in the A/B."""
    url, counts = slow_server
    port = str(free_local_port())  # the master's, on 127.0.0.1 (as loadtests.ab.abtest does)
    out = tmp_path / "per_server.json"
    result = subprocess.run(
        [sys.executable, "-m", "locust", "-f", os.path.join(ROOT, "loadtests", "locustfile.py"),
         "--headless", "--only-summary", "--users", "4", "--spawn-rate", "4", "--run-time", "4s",
         "--stop-timeout", "10", "--processes", "2", "--master-bind-host", "127.0.0.1",
         "--master-bind-port", port, "--master-port", port, "--host", url,
         "--weights", "root=1,plone=0,json=0,blob=0", "--per-server-stats", str(out), "--loglevel", "WARNING"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert set(counts) == {"a", "b"}
    assert {name: s["num_requests"] for name, s in data["server_totals"].items()} == counts
    assert sum(e["num_requests"] for e in data["total"].values()) == sum(counts.values())
    assert data["missing_final_reports"] == 0


def test_warm_mark_holds_the_instant_the_windows_start_from(slow_server, tmp_path):
    """The --warm-mark file (which the A/B reads to cut HAProxy's log into windows) holds
    the same epoch second as the per-server windows' origin (``warm_at``), whenever the
    file itself was written: a late file (its greenlet wakes late on a busy machine) must not
    shift the log's windows against Locust's."""
    url, counts = slow_server
    out, mark = tmp_path / "per_server.json", tmp_path / "warm.mark"
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "locust", "-f", os.path.join(ROOT, "loadtests", "locustfile.py"),
         "--headless", "--only-summary", "--users", "2", "--spawn-rate", "2", "--run-time", "4s",
         "--stop-timeout", "10", "--warmup", "1.5", "--warm-mark", str(mark), "--window", "1",
         "--host", url, "--weights", "root=1,plone=0,json=0,blob=0", "--per-server-stats", str(out),
         "--loglevel", "WARNING"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(out.read_text())
    warm_at = float(mark.read_text())
    assert warm_at == data["warm_at"]
    assert started + 1.5 <= warm_at <= mark.stat().st_mtime
    assert sum(data["warmup_requests"].values()) > 0 and data["windows"], data
