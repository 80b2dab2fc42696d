"""The helpers every load tool of plonedeploy shares: the stack's facts, CPU accounting, wrk,
waiting for quiet, percentiles, the report folder and its Markdown tables.

The subcommands (``python -m loadtests <subcommand>``) import what they need from here and
never from each other. Units: seconds for times and CPU, bytes for sizes, requests/s for
rates, unless a name says otherwise (``_us`` microseconds, ``_ms`` milliseconds).
"""
import argparse
import datetime
import functools
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import psutil

from loadtests import haproxy_stats

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: The stack's contract, written by bin/buildout (the ``stack`` part).
STACK_JSON = os.path.join(ROOT, "parts", "stack", "stack.json")
#: wrk script: optional Accept header from the environment, one-line JSON summary at the end.
WRK_SCRIPT = os.path.join(HERE, "wrk_summary.lua")
#: wrk script of the write path: plone.restapi POSTs of Documents (wrk_post.lua's header).
WRK_POST_SCRIPT = os.path.join(HERE, "wrk_post.lua")

#: path label -> (URL path, Accept header); the labels of the Locust tests.
PATHS = {
    "/": ("/", ""),
    "/Plone": ("/Plone", ""),
    "@json": ("/Plone", "application/json"),
    "blob": ("/Plone/blob-5mb/@@download/file", ""),
}
#: Bytes of the blob behind ``PATHS["blob"]``; scripts/create_site.py makes it this size.
BLOB_SIZE = 5 * 1024 * 1024


# ----------------------------------------------------------------------------- arguments

def new_parser(subcommand, description, **kwargs):
    """The ``argparse.ArgumentParser`` of a subcommand: ``prog`` is how it is called,
    ``python -m loadtests <subcommand>`` (its usage and errors say so), ``description`` the
    one line under it; ``kwargs`` go to ArgumentParser (``epilog``, ...)."""
    return argparse.ArgumentParser(prog=f"python -m loadtests {subcommand}", description=description, **kwargs)


def add_stack_arguments(parser, stack_config=True):
    """Add the options every tool shares to an ``argparse`` parser: ``--stack-config`` (the
    stack's contract, default parts/stack/stack.json; left out with ``stack_config=False``,
    for tools that build stacks of their own) and ``--out`` (default var/reports)."""
    if stack_config:
        parser.add_argument("--stack-config", default=STACK_JSON,
                            help="stack.json written by bin/buildout (default parts/stack/stack.json)")
    parser.add_argument("--out", default=os.path.join(ROOT, "var", "reports"),
                        help="folder for the report folder (default var/reports)")


def add_run_arguments(parser, *, duration, warmup=None, rounds=None, duration_help="", warmup_help="",
                      rounds_help=""):
    """Add ``--duration`` (measured seconds per run) and, where a default is given,
    ``--warmup`` (uncounted seconds of load before each run) and ``--rounds`` (repetitions
    of the whole set, int), with the subcommand's defaults in the help; ``duration_help``,
    ``warmup_help`` and ``rounds_help`` replace the generic help text (the default is appended). Each seconds
    option parses as the type of its default (int for tools that hand it to wrk or Locust as
    whole seconds). Checks no bounds: the caller knows its own."""
    parser.add_argument("--duration", type=type(duration), default=duration,
                        help=(duration_help or "measured seconds per run") + f" (default {duration:g})")
    if warmup is not None:
        parser.add_argument("--warmup", type=type(warmup), default=warmup, help=(
            warmup_help or "seconds of uncounted load before each run (caches, ZODB connections, "
            "HAProxy's first picks)") + f" (default {warmup:g})")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help=(
            rounds_help or "repetitions of the whole set, alternating the order, so every "
            "comparison is of runs minutes apart under the same foreign load") + f" (default {rounds})")


def add_counts_argument(parser, option, default, help):
    """Add ``option`` (such as ``--connections``): a comma-separated list of integers >= 1,
    turned into a list by :func:`parse_counts` while argparse reads the command line, so
    ``args`` holds ``[int]`` (the default too, given as text such as ``"10,100"``; None stays
    None for a default the caller fills in). ``help`` gets ``(default ...)`` appended unless
    the default is None. A bad value exits 2 naming the option."""
    parser.add_argument(option, type=lambda text: parse_counts(parser, option, text), default=default,
                        help=help if default is None else f"{help} (default {default})")


def add_buildout_config_argument(parser, extended_by):
    """Add ``--buildout-config``: the config the stack was built with, which the tool's extra
    buildout (``extended_by``, text for the help) extends. Its default is None: the caller
    takes :func:`default_buildout_config` then (what ``make build`` recorded, else local.cfg
    or buildout.cfg), read when the tool runs rather than when --help is shown."""
    parser.add_argument("--buildout-config", default=None,
                        help=f"the config the stack was built with, extended by {extended_by}; default: what "
                        "make build recorded (var/buildout-config), else local.cfg if it exists, else buildout.cfg")


def parse_counts(parser, option, text, minimum=1):
    """``"10,100"`` -> ``[10, 100]``: a comma-separated list of integers >= ``minimum`` given
    to ``option`` (such as ``--connections``); anything else ends in ``parser.error`` naming
    the option, what was given and what is allowed (exit status 2)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = None
    if not counts or min(counts) < minimum:
        parser.error(f"{option}: expected comma-separated integers >= {minimum}, got {text!r}")
    return counts


# ----------------------------------------------------------------------------- the stack

class NotReady(RuntimeError):
    """A run cannot start: the stack is not built, not running or not healthy, or wrk is
    missing. The message says which and what to run; :func:`exits_2_when_not_ready` prints
    it and exits 2."""


def exits_2_when_not_ready(prog):
    """Decorator for a tool's ``main(argv)``: a NotReady it raises is printed as
    ``<prog>: <message>`` on stderr and main returns 2 (nothing was run). Keyword
    arguments pass through (the subcommand name an alias gives)."""
    def decorate(main):
        @functools.wraps(main)
        def run(argv=None, **kwargs):
            try:
                return main(argv, **kwargs)
            except NotReady as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 2
        return run
    return decorate


def require_wrk():
    """Path of the ``wrk`` binary on PATH; raises NotReady when it is not installed."""
    wrk = shutil.which("wrk")
    if not wrk:
        raise NotReady("wrk not found: install Debian's package (apt-get install wrk; make system)")
    return wrk


def load_stack(path=STACK_JSON):
    """Read the stack's facts from ``parts/stack/stack.json`` (or the file at ``path``).

    Returns the parsed dict (``processes``, ``run_dir``, ``frontend_url``, ``stats_url``,
    ``backend``, ``servers``, ``server_kinds``, ...). Raises NotReady when the file is
    missing or not JSON.
    """
    try:
        with open(path, encoding="utf-8") as fp:
            return json.load(fp)
    except FileNotFoundError:
        raise NotReady(f"{path} not found: run bin/buildout first (make build)") from None
    except (OSError, ValueError) as exc:
        raise NotReady(f"{path} unreadable ({exc}): run bin/buildout again (make build)") from None


def fetch_stats(config):
    """The rows of the stack's HAProxy stats CSV (see :func:`haproxy_stats.fetch`); raises
    NotReady when the stats page does not answer."""
    try:
        return haproxy_stats.fetch(config["stats_url"])
    except OSError as exc:
        raise NotReady(f"HAProxy stats at {config['stats_url']} not answering ({exc}): "
                       "start the stack with 'make start'") from None


def check_servers_up(config):
    """Check that the stack's HAProxy answers and reports every server of its backend UP.

    Returns the stats rows read. Raises NotReady when the stats do not answer or a
    server is not UP.
    """
    rows = fetch_stats(config)
    states = {n: r["status"] for n, r in haproxy_stats.servers(rows, config["backend"]).items()}
    if not states or any(s != "UP" for s in states.values()):
        raise NotReady(f"not every server is UP: {states}; see 'bin/stack status'")
    return rows


def default_buildout_config():
    """Path of the config the stack was built with, which extra buildouts (A/B slots, the
    blob benchmark's clients) extend.

    ``make build`` writes it to ``var/buildout-config`` (``STORAGE=relstorage`` builds
    ``relstorage.cfg``); that record counts while it is not older than ``.installed.cfg``.
    When bin/buildout ran after it, or without make: ``local.cfg`` if it exists, else
    ``buildout.cfg``.
    """
    record, installed = os.path.join(ROOT, "var", "buildout-config"), os.path.join(ROOT, ".installed.cfg")
    try:
        if os.path.getmtime(record) >= os.path.getmtime(installed):
            with open(record, encoding="utf-8") as fp:
                path = fp.read().strip()
            if os.path.exists(path):
                return path
    except OSError:
        pass
    local = os.path.join(ROOT, "local.cfg")
    return local if os.path.exists(local) else os.path.join(ROOT, "buildout.cfg")


def stack_pids(config):
    """Return ``{process name: psutil.Process}`` for the stack's running processes (as the
    stack's supervisord says: plonedeploy.stack.running_pids); processes not
    running are left out."""
    from plonedeploy.stack.supervisor import running_pids

    procs = {}
    for name, pid in running_pids(config).items():
        try:
            procs[name] = psutil.Process(pid)
        except psutil.Error:
            pass
    return procs


def running_zeo_server(config):
    """``"host:port"`` of the stack's running ZEO server, for the tools that build ZEO clients
    of their own beside the stack's (matrix, servers-wrk, scaling), checked before they build
    anything.

    ``config``: stack.json's dict (:func:`load_stack`). Raises NotReady as :func:`zeo_server`,
    and when the ZEO server's process (``zeoserver`` of stack.json) is not running.
    """
    address, _ = zeo_server(config)
    name = config.get("zeoserver") or "zeoserver"
    if name not in stack_pids(config):
        raise NotReady(f"the stack's {name} is not running: make start")
    return address


def frontend_maxconn(config):
    """Connections (int) the site's HAProxy frontend holds at once (``frontend_maxconn`` of
    stack.json), or None when the contract does not say (the Ansible role's abtest.json)."""
    return config.get("frontend_maxconn")


def client_facts(config, part):
    """``{"server", "threads", "url", "blob_sendfile", "metrics_url"}`` of the stack's ZEO
    client ``part`` (``clients`` of stack.json: wsgi-server, threads = its HAProxy maxconn
    in the page lane, base URL ``http://host:port``, whether the blobsendfile filter is
    on, Prometheus URL or None). Raises NotReady when stack.json has no such client (an
    older build: run bin/buildout again)."""
    try:
        return config["clients"][part]
    except KeyError:
        raise NotReady(f"stack.json describes no client {part!r}: run bin/buildout again (make build)") from None


def client_urls(config, parts=None):
    """``{client part: base URL without trailing /}`` for ``parts`` (default: the pool's
    ``servers``), in that order. Raises NotReady as :func:`client_facts`."""
    return {part: client_facts(config, part)["url"] for part in (config["servers"] if parts is None else parts)}


def zeo_server(config):
    """``(ZEO address "host:port", blob directory)`` of the stack, for tools that build more
    ZEO clients of it (``zeo_address``/``blob_storage`` of stack.json). Raises NotReady for
    a stack without a ZEO server (RelStorage: ``storage`` of stack.json) or an older
    stack.json."""
    if config.get("storage") == "relstorage":
        raise NotReady("the stack is built for RelStorage on PostgreSQL (relstorage.cfg), and this tool "
                       "builds ZEO clients of the stack's ZEO server, which a RelStorage build does not "
                       "have: build and start the ZEO stack (make build STORAGE=zeo; make start)")
    if not config.get("zeo_address") or not config.get("blob_storage"):
        raise NotReady("stack.json names no ZEO server and blob directory (a RelStorage stack, or "
                       "built before they were recorded: run bin/buildout again)")
    return config["zeo_address"], config["blob_storage"]


def service_user(config):
    """The stack's service user (stack.json's ``service``), or ``""`` without one: what a
    tool that builds more ZEO clients of the stack's ZEO server gives them as
    ``service-user``, so that, started as root, they write the shared blob directory as the
    ZEO server's own user (plonedeploy.runtime.access.become)."""
    return (config.get("service") or {}).get("user", "")


def render_haproxy(config, **changes):
    """Text of an HAProxy config for a variant of the stack: the project's template
    (``haproxy_template`` of stack.json, the project's haproxy/haproxy.cfg.j2) rendered with the variables
    the stack's HAProxy was rendered with (``haproxy_context``), each key of ``changes``
    replacing one (``balance="roundrobin"``, ``bind="127.0.0.1:8090"``, ``servers=[{"name",
    "host", "port", "maxconn", "wsgi_server"}]``, ...). Raises NotReady when stack.json has no
    ``haproxy_context`` (an older build, or the Ansible role's abtest.json), KeyError for a
    key the template does not use."""
    from plonedeploy.recipe.options import render_template

    context = config.get("haproxy_context")
    if not context or not config.get("haproxy_template"):
        raise NotReady("stack.json has no haproxy_context: run bin/buildout again (make build); "
                       "the Ansible role's abtest.json describes no HAProxy to vary")
    unknown = sorted(set(changes) - set(context))
    if unknown:
        raise KeyError(f"not a variable of {config['haproxy_template']}: {', '.join(unknown)}")
    return render_template(config["haproxy_template"], {**context, **changes})


def wait_backend_idle(config, timeout=120.0):
    """Wait until HAProxy's backend has no request queued or in progress (the previous
    run's requests are gone); return the seconds waited. Raises RuntimeError on timeout."""
    started = time.monotonic()
    while True:
        row = haproxy_stats.backend_row(haproxy_stats.fetch(config["stats_url"]), config["backend"])
        if int(row["qcur"] or 0) == 0 and int(row["scur"] or 0) == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"HAProxy backend still busy after {timeout} s: "
                               f"{row['qcur']} queued, {row['scur']} in progress")
        time.sleep(0.5)


# ----------------------------------------------------------------------------- CPU, RSS, descriptors

def cpu_seconds(processes):
    """Return ``{name: user+system CPU seconds}`` (reaped children included) for a dict of
    psutil processes; processes that are gone are left out."""
    out = {}
    for name, proc in processes.items():
        try:
            t = proc.cpu_times()
            out[name] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return out


def machine_busy_seconds():
    """CPU seconds the whole machine spent not idle since boot (all cores summed)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def children_cpu_seconds():
    """CPU seconds (user + system) of this process' reaped children (wrk, Locust)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def own_cpu_seconds():
    """CPU seconds (user + system) of this process and its reaped children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime + children_cpu_seconds()


def tree_processes(root_pid):
    """``[psutil.Process]`` of ``root_pid`` and its descendants; empty when it is gone."""
    try:
        parent = psutil.Process(root_pid)
        return [parent] + parent.children(recursive=True)
    except psutil.Error:
        return []


def tree_cpu_seconds(root_pid):
    """CPU seconds (user + system, reaped children included) of the process tree of
    ``root_pid``, or the sum over the trees of a list of PIDs."""
    return sum(cpu_seconds({p.pid: p for root in _roots(root_pid) for p in tree_processes(root)}).values())


def _roots(root_pid):
    """``[pid]`` of one PID or a list of PIDs (tree_cpu_seconds, RssSampler)."""
    return [root_pid] if isinstance(root_pid, int) else list(root_pid)


class RssSampler(threading.Thread):
    """Samples the summed RSS (bytes) of the process tree of ``root_pid`` (a PID, or a list
    of PIDs whose trees are summed: a balanced cell's clients and HAProxy) every
    ``interval`` seconds until :meth:`stop`; ``peak`` is the largest sample (bytes)."""

    def __init__(self, root_pid, interval=0.2):
        super().__init__(daemon=True)
        self.roots = _roots(root_pid)
        self.interval, self.peak = interval, 0
        self._stop_event = threading.Event()

    def sample(self):
        """Take one sample now and update ``peak``."""
        total = 0
        for proc in (p for root in self.roots for p in tree_processes(root)):
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        self.peak = max(self.peak, total)

    def run(self):
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self):
        """Stop sampling, wait for the thread, and take a last sample."""
        self._stop_event.set()
        self.join()
        self.sample()


def free_local_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice of an
    ephemeral port). Another program may take it before the caller binds it; the callers
    bind within a second, and a clash fails their bind with "Address already in use"."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def raise_fd_limit(needed):
    """Raise this process' soft RLIMIT_NOFILE (inherited by wrk and started servers) towards
    ``needed`` descriptors. Returns the (soft, hard) limits after the attempt; the hard limit
    is never exceeded."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def listen_overflows():
    """``TcpExt: ListenOverflows`` of /proc/net/netstat (int): connections the kernel dropped
    because a listening socket's accept queue (its backlog, at most net.core.somaxconn)
    was full. Counts for the whole network namespace since boot; 0 where the file is
    missing."""
    try:
        with open("/proc/net/netstat", encoding="ascii") as fp:
            lines = fp.read().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split()[1:], values.split()[1:])).get("ListenOverflows", 0))
    return 0


# ----------------------------------------------------------------------------- waiting for quiet

def foreign_cores(procs, seconds=2.0):
    """Cores (0.0 .. number of cores) used over ``seconds`` by other processes than ours:
    ``procs`` (``{name: psutil.Process}``), this process and its reaped children."""
    ours_before, busy_before = cpu_seconds(procs), machine_busy_seconds()
    mine_before = own_cpu_seconds()
    started = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    ours = sum(cpu_seconds(procs).get(n, 0) - v for n, v in ours_before.items())
    mine = own_cpu_seconds() - mine_before
    return max(machine_busy_seconds() - busy_before - ours - mine, 0.0) / wall


def wait_for_quiet(procs, max_foreign, timeout):
    """Wait until other processes use at most ``max_foreign`` cores (see
    :func:`foreign_cores`) or ``timeout`` seconds passed; returns the seconds waited.

    Other users' load makes a run slower for reasons unrelated to what is measured; runs
    are alternated anyway, this only avoids the worst minutes.
    """
    started = time.monotonic()
    while timeout > 0:
        load = foreign_cores(procs)
        if load <= max_foreign or time.monotonic() - started >= timeout:
            break
        time.sleep(3)
    return round(time.monotonic() - started, 1)


def wait_tree_idle(root_pid, max_seconds=60.0, window=0.3, idle_cores=0.1):
    """Wait until the process tree of ``root_pid`` (or the trees of a list of PIDs) uses
    less than ``idle_cores`` cores over a ``window`` (seconds), at most ``max_seconds``;
    returns the seconds waited.

    wrk abandons the requests in flight when it stops, but a server without disconnect
    detection (pyruvate, waitress's threads) still serves the requests it queued, up to one
    per connection: without this wait they would run into the next run of that server.
    """
    started = time.monotonic()
    before = tree_cpu_seconds(root_pid)
    while time.monotonic() - started < max_seconds:
        time.sleep(window)
        now = tree_cpu_seconds(root_pid)
        if now - before < idle_cores * window:
            break
        before = now
    return time.monotonic() - started


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


# ----------------------------------------------------------------------------- percentiles

def percentile(values, fraction):
    """Nearest-rank percentile: the smallest of ``values`` with at least ``fraction``
    (0 < fraction <= 1) of them at or below it (numpy's ``inverted_cdf``). ``values`` need
    not be sorted. Returns a Python number, or None when ``values`` is empty."""
    if len(values) == 0:
        return None
    return np.quantile(np.asarray(values), fraction, method="inverted_cdf").item()


def littles_law(connections, rps, p99):
    """``{"littles_law_mean_s", "p99_over_littles_mean"}`` of a closed-loop run: the mean
    latency (seconds) ``connections`` must show at ``rps`` requests/s if every connection is
    served in turn (Little's law: connections / rps), and the p99 latency ``p99`` (seconds)
    over it, a measure of unfairness (1 is as fair as a queue gets). Rounded to 3 and 2
    places; None where rps is 0 (or ``p99`` None: no completed request)."""
    little = connections / rps if rps else None
    return {"littles_law_mean_s": round(little, 3) if little else None,
            "p99_over_littles_mean": round(p99 / little, 2) if little and p99 is not None else None}


def histogram_percentile(histogram, fraction):
    """Response time (ms) within which ``fraction`` (0..1) of the requests finished, from
    Locust's histogram ``{rounded ms: count}`` (keys may be strings, as in JSON).

    Same rule as ``locust.stats.calculate_response_time_percentile`` (so the reports agree
    with Locust's own): the bucket holding request number ``int(total * fraction) + 1``
    counted from the fastest. Locust itself cannot be imported here (it monkey-patches the
    process with gevent). Returns an int, or None for an empty histogram.
    """
    counts = {int(ms): n for ms, n in histogram.items()}
    keys = np.array(sorted(counts), dtype=np.int64)
    cumulative = np.cumsum([counts[k] for k in keys.tolist()])
    if not len(keys) or cumulative[-1] == 0:
        return None
    index = np.searchsorted(cumulative, int(cumulative[-1] * fraction), side="right")
    return int(keys[min(index, len(keys) - 1)])


# ----------------------------------------------------------------------------- reports

def spread(values):
    """``{"median", "min", "max"}`` of ``values`` (numbers, rounded to 2 places), or None
    when empty: how a figure measured once per round is reported."""
    if not values:
        return None
    return {"median": round(float(np.median(values)), 2), "min": round(float(min(values)), 2),
            "max": round(float(max(values)), 2)}


def format_spread(value, digits=0):
    """``"median (min–max)"`` of a :func:`spread` with ``digits`` decimals and thousands
    separators, or ``"-"`` for None."""
    if value is None:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    return f"{fmt.format(value['median'])} ({fmt.format(value['min'])}–{fmt.format(value['max'])})"


def new_figure(rows=1, cols=1, figsize=(6, 4)):
    """``(fig, axes)`` of ``matplotlib.pyplot.subplots(rows, cols, figsize=figsize)`` (inches)
    on the Agg backend: files only, no display. matplotlib is imported here, on the first
    plot, so tools and tests that draw nothing do not load it. Pair with ``save_figure``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=figsize)


def save_figure(fig, path, dpi=100):
    """Lay ``fig`` out, write it to ``path`` (PNG, ``dpi`` dots per inch) and close it (pyplot
    keeps every open figure in memory)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


_FIGURE = re.compile(r"(-|-?[\d,]*\.?\d+%?)?")  # blank cells count as figures


def spread_bars(ax, labels, series, capsize=3):
    """Grouped bars on the matplotlib axes ``ax``: one group per x label of ``labels``, one
    bar per entry of ``series`` (``[(legend name, {label: spread or None})]``, spreads as
    :func:`spread` returns) at its median with a min–max whisker; a missing spread leaves a
    gap. Sets the x ticks to ``labels``; scale, titles and legend are the caller's."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series):
        xs, ys, low, high = [], [], [], []
        for j, label in enumerate(labels):
            value = values.get(label)
            if value:
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                ys.append(value["median"])
                low.append(value["median"] - value["min"])
                high.append(value["max"] - value["median"])
        ax.bar(xs, ys, width, yerr=[low, high], capsize=capsize, label=name)
    ax.set_xticks(range(len(labels)), list(labels))


def markdown_table(headers, rows):
    """Markdown table text (no trailing newline): ``headers`` the column titles, ``rows``
    lists of cells, one per header.

    A cell shows as ``str(cell)``, except None as ``-`` and ints with thousands separators
    (``12,345``). A column is right-aligned when all its cells are figures (numbers, None, or
    text such as ``1,234.5``, ``49.9%`` or ``-``), left-aligned otherwise. Raises ValueError
    for a row of the wrong length.
    """
    def numeric(cell):
        if isinstance(cell, str):
            return _FIGURE.fullmatch(cell) is not None
        return cell is None or (isinstance(cell, (int, float)) and not isinstance(cell, bool))

    def show(cell):
        if cell is None:
            return "-"
        if isinstance(cell, int) and not isinstance(cell, bool):
            return f"{cell:,}"
        return str(cell)

    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row of {len(row)} cells for {len(headers)} columns: {row!r}")
    aligns = ["---:" if all(numeric(row[i]) for row in rows) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(aligns) + "|"]
    lines += ["| " + " | ".join(show(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def report_folder(out, subcommand, started=None):
    """``<out>/<subcommand>-<YYYYmmdd-HHMMSS>`` (``started`` a datetime, default now),
    created; returns its path."""
    started = started or datetime.datetime.now()
    folder = os.path.join(out, f"{subcommand}-{started.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(folder, exist_ok=True)
    return folder


def write_report(folder, data, markdown, plots=()):
    """Write ``report.json`` (``data``, indent 2, keys in their order) and ``report.md``
    (``markdown``, a str) into ``folder``, then each plot of ``plots``, pairs ``(file name,
    function(path))``, drawn after the text files so a failing plot leaves the figures on
    disk. Returns the paths written: JSON, Markdown, then the plots."""
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, "report.json"), os.path.join(folder, "report.md")]
    with open(paths[0], "w", encoding="utf-8") as fp:
        json.dump(data, fp, indent=2)
    with open(paths[1], "w", encoding="utf-8") as fp:
        fp.write(markdown)
    for name, draw in plots:
        paths.append(os.path.join(folder, name))
        draw(paths[-1])
    return paths


def finish_report(folder, data, markdown, plots=(), problems=()):
    """End of a subcommand's run: :func:`write_report` into ``folder``, then print the
    Markdown, one ``problem: ...`` line per entry of ``problems`` (str) and the folder.
    Returns the exit status: 1 when there were problems, else 0."""
    write_report(folder, data, markdown, plots)
    print(markdown)
    for problem in problems:
        print(f"problem: {problem}")
    print(f"report: {folder}")
    return 1 if problems else 0
