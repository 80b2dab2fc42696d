"""The wrk driver: ``require_wrk`` and ``run_wrk`` (one run, the summary of ``wrk_summary.lua``;
``WRK_POST_SCRIPT`` for plone.restapi POSTs).
"""
import json
import os
import re
import shutil
import subprocess
import time

from loadtests.core.procs import children_cpu_seconds
from loadtests.core.stack import HERE, NotReady


#: wrk script: optional Accept header from the environment, one-line JSON summary at the end.
WRK_SCRIPT = os.path.join(HERE, "wrk_summary.lua")
#: wrk script of the write path: plone.restapi POSTs of Documents (wrk_post.lua's header).
WRK_POST_SCRIPT = os.path.join(HERE, "wrk_post.lua")


def require_wrk():
    """Path of the ``wrk`` binary on PATH; raises NotReady when it is not installed."""
    wrk = shutil.which("wrk")
    if not wrk:
        raise NotReady("wrk not found: install Debian's package (apt-get install wrk; make system)")
    return wrk


# ----------------------------------------------------------------------------- wrk

_WRK_SUMMARY = re.compile(r"^PLONEDEPLOY_WRK (\{.*\})$", re.MULTILINE)


def run_wrk(url, connections, duration, *, threads=1, timeout=30, accept="", wrk="wrk", progress=None,
            script=WRK_SCRIPT, env=None):
    """Run wrk once against ``url`` with ``script`` (default ``wrk_summary.lua``); return its summary.

    ``connections``: wrk ``-c``; ``duration``: seconds (``-d``); ``threads``: wrk ``-t``
    (at most ``connections``); ``timeout``: seconds wrk waits for one response before it
    counts a timeout error; ``accept``: Accept header ('' for none); ``wrk``: the binary;
    ``progress``: called every 5 s with the elapsed seconds while wrk runs; ``script``: a wrk
    Lua script that prints the ``PLONEDEPLOY_WRK`` summary line (``wrk_summary.lua`` or one
    that loads it, such as :data:`WRK_POST_SCRIPT`); ``env``: extra environment variables
    for wrk (``{name: str}``), read by the script, so secrets stay off the command line.

    Returns ``{"requests", "duration_us", "bytes", "errors": {"connect", "read", "write",
    "status", "timeout"}, "latency_us": {"mean", "stdev", "max", "p50", "p90", "p95",
    "p99", "p99.9"}}`` (wrk's counters; ``status`` counts non-2xx/3xx answers) plus
    ``wall_s`` (seconds wrk ran) and ``cpu_s`` (wrk's CPU seconds, user + system).
    Raises RuntimeError with wrk's output when it fails, prints no summary, or runs more
    than 120 s past ``duration`` (it is killed then).
    """
    cmd = [wrk, f"-t{max(1, min(threads, connections))}", f"-c{connections}", f"-d{duration}s",
           f"--timeout={timeout}s", "-s", script, url]
    env = dict(os.environ, PLONEDEPLOY_ACCEPT=accept, **(env or {}))
    cpu_before = children_cpu_seconds()
    started = time.monotonic()
    deadline = started + duration + 120
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        while True:
            try:
                output, _ = proc.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{' '.join(cmd)} still running {duration + 120} s after its start")
                if progress:
                    progress(time.monotonic() - started)
    finally:
        if proc.poll() is None:  # interrupted or stuck: never leave wrk running
            proc.kill()
            proc.wait()
    found = _WRK_SUMMARY.search(output)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{output}")
    summary = json.loads(found.group(1))
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["cpu_s"] = round(children_cpu_seconds() - cpu_before, 3)
    return summary
