"""The memory watchdog on the running stack (issue 28, item 3; docs/how-to/operate.md, "Memory
watchdog"): a client whose memory-limit is below its working size, under a wrk load
through HAProxy, is recycled (drained through /readyz, SIGTERM to itself, started again by
the stack's supervisord, warm) until its backoff stops it; no request fails and the two page
clients are never out of HAProxy's pool together.

The limit is given by editing the client's built ``etc/wsgi.ini`` (its ``[filter:metrics]``)
and restarting it, and undone the same way, so the build stays the stack of every other test.
"""
import os
import re
import threading
import time

import pytest
import requests

from conftest import ROOT, STACK, run, wait_for
from loadtests.core.wrk import require_wrk, run_wrk
from metrics_address import parse, value

pytestmark = pytest.mark.integration

NAME, PEER = "instance", "client2"
LIMIT = 64 * 1024 * 1024     # a client of the demo site holds 184-256 MiB: always above
GRACE = 10                   # seconds above the limit before a recycle
RESTARTS = 1                 # recycles per hour, then the backoff (one: the backoff after the
                             # restart proves the count outlived the process, as a second would)


def _out(status):
    """HAProxy sends the server no new request (DOWN, MAINT, DRAIN/NOLB; "DOWN 1/2" is on
    its way up but still out); "UP 1/3" is on its way down but still in."""
    return not status.startswith("UP")


def _metrics(stack, name):
    with requests.get(stack.config["clients"][name]["metrics_url"], timeout=10) as answer:
        return parse(answer.text)


def _set_watchdog(ini, limit, grace, restarts):
    """Rewrite the watchdog's lines of ``ini``'s [filter:metrics]; return the old text."""
    text = open(ini, encoding="utf-8").read()
    new = text
    for key, val in (("memory_limit", limit), ("memory_limit_grace", grace), ("memory_limit_restarts", restarts)):
        new, count = re.subn(rf"^{key} = .*$", f"{key} = {val}", new, flags=re.MULTILINE)
        assert count == 1, (key, ini)
    with open(ini, "w", encoding="utf-8") as out:
        out.write(new)
    return text


def _load(url, stop, summaries, chunk=20):
    """wrk against ``url`` (4 connections, as many as the two page clients' maxconn
    together: while one is out, HAProxy queues 2 for the other), in runs of ``chunk``
    seconds until ``stop`` is set; appends each run's summary (loadtests.core.wrk.run_wrk:
    requests and errors, ``status`` = non-2xx/3xx answers)."""
    wrk = require_wrk()
    while not stop.is_set():
        summaries.append(run_wrk(url, 4, chunk, threads=2, timeout=60, wrk=wrk))


def _watch(stack, stop, seen):
    while not stop.is_set():
        try:
            now = stack.server_states()
        except Exception as exc:  # noqa: BLE001 -- recorded, asserted below
            now = {"error": repr(exc)}
        seen.append((time.monotonic(), now))
        time.sleep(0.25)


@pytest.mark.timeout(1200)  # two recycles of ~40-90 s each on the busy machine, the backoff, two restarts
def test_a_client_above_its_limit_is_recycled_until_the_backoff_without_a_failed_request(stack):
    ini = os.path.join(ROOT, "parts", NAME, "etc", "wsgi.ini")
    state_file = os.path.join(ROOT, "var", NAME, "memory-recycles")
    log_path = os.path.join(ROOT, "var", "log", f"{NAME}.log")
    assert "memory_limit = " in open(ini, encoding="utf-8").read(), "this build has no memory watchdog"
    if os.path.exists(state_file):
        os.remove(state_file)
    log_start = os.path.getsize(log_path)
    original = _set_watchdog(ini, LIMIT, GRACE, RESTARTS)
    stop, summaries, seen = threading.Event(), [], []
    loaders = [threading.Thread(target=_load, args=(stack.frontend_url + "/Plone", stop, summaries))]
    watcher = threading.Thread(target=_watch, args=(stack, stop, seen))
    try:
        # The rolling restart (drain, restart, ready, UP) gives it the new settings; it
        # takes longer than GRACE plus a tick, so the watchdog may already be at work.
        run([STACK, "restart", NAME], timeout=300, check=False)
        watcher.start()
        started = time.monotonic()
        for loader in loaders:
            loader.start()

        def backoff():
            try:
                return value(_metrics(stack, NAME), "plonedeploy_memory_recycle_blocked", reason="backoff") == 1
            except (requests.RequestException, OSError, AssertionError):
                return False  # restarting, or its watchdog not started yet

        took = wait_for(backoff, 900, f"{NAME} in its backoff after {RESTARTS} recycles")
        # Serve on for a while in the backoff: no further recycle, the load still answered.
        time.sleep(15)
        series = _metrics(stack, NAME)
    finally:
        stop.set()
        for thread in loaders + ([watcher] if watcher.is_alive() else []):
            thread.join(150)  # the last wrk run ends within its 20 s
        with open(ini, "w", encoding="utf-8") as out:
            out.write(original)
        if os.path.exists(state_file):
            os.remove(state_file)
        run([STACK, "restart", NAME], timeout=300, check=False)
    log = open(log_path, encoding="utf-8").read()[log_start:]
    recycles = [line for line in log.splitlines() if "memory watchdog: " in line and "SIGTERM" in line]
    blocked = [line for line in log.splitlines() if "memory watchdog: not recycling" in line]
    requests_sent = sum(summary["requests"] for summary in summaries)
    failed = {kind: sum(summary["errors"][kind] for summary in summaries)
              for kind in ("connect", "read", "write", "status", "timeout")}
    both_out = [(t - started, s) for t, s in seen if "error" not in s and _out(s[NAME]) and _out(s[PEER])]
    out_of_pool = sum(1 for _, s in seen if "error" not in s and _out(s[NAME]))
    print(f"\n{NAME} (memory-limit {LIMIT >> 20} MiB, grace {GRACE} s, {RESTARTS} per hour): backoff after "
          f"{took:.0f} s of wrk load; {len(recycles)} recycles; {requests_sent} requests through HAProxy "
          f"in {len(summaries)} wrk runs, errors {failed}; {NAME} out of the pool in {out_of_pool} of {len(seen)} "
          f"polls, both page clients out in {len(both_out)}")
    for line in recycles + blocked[:1]:
        print("  " + line.strip())
    assert len(recycles) == RESTARTS, recycles
    assert blocked, "no 'not recycling' line"
    assert value(series, "plonedeploy_memory_restarts_total") == RESTARTS
    assert requests_sent > 0 and not any(failed.values()), failed
    assert both_out == [], both_out[:10]
    assert out_of_pool > 0, "HAProxy never took it out: the recycles were not drained through /readyz"
    assert not [s for _, s in seen if "error" in s], "HAProxy's stats did not answer"
    wait_for(lambda: stack.all_up(), 120, "every server UP after the limit was undone")
