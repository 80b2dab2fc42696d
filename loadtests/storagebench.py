"""ZEO vs RelStorage on PostgreSQL, side by side in one run (issue 14; docs/storage.md).

    python -m loadtests storage [--variants zeo,relstorage,relstorage-shared]
        [--paths /,/Plone,@json,blob,write] [--connections 1,10,100] [--server pyruvate]
        [--duration 5] [--warmup 2] [--rounds 3] [--base-port 9700] [--work-dir var/storagebench]

Needs no running stack: it builds and starts its own, one per variant, each a buildout of
its own in ``<work-dir>/<variant>`` (made afresh every run: an empty database) on ports of
its own (``--base-port`` + 15 per variant), with the checkout's eggs:

- ``zeo``: ``buildout.cfg``'s zeoserver and its ``instance`` client (Data.fs and the blob
  directory in ``<variant>/var``);
- ``relstorage``: ``relstorage.cfg``'s local PostgreSQL 15 (the ``[postgresql]`` part) and
  the same client with ``storage = relstorage``, ``relstorage-blobs = database`` (blobs in
  PostgreSQL, each client with a blob cache);
- ``relstorage-shared``: the same with ``relstorage-blobs = shared-directory`` (blobs as
  files in one directory, none in PostgreSQL).

Each client is the ``[instance]`` part as built (``--server``, default pyruvate; 2 workers
or threads, ``pool-size`` 2); only its storage differs. Per variant: the database starts,
``scripts/create_site.py`` (``bin/instance run``) creates the demo site with its 5 MiB blob
and the admin user (password generated into ``<variant>/var/admin-password``, 0600), the
``relstorage`` blob cache is emptied, the client starts, the first blob download is timed
(``first_blob_s``: with blobs in the database, the client copies the blob out of PostgreSQL
into its cache), and a folder ``bench-writes`` is created for the write path.

Reads go **directly to the client**, not through an HAProxy: what differs is the storage,
and a balancer in front would add the same hop and its own queue (``maxconn``) to both,
hiding part of the client's latency in HAProxy's queue and adding a process whose CPU is not
the storage's. Writes go through the variant's HAProxy, whose **write lane** (buildout.cfg's
default ``write-lane = on``) passes them to the client one at a time, as the kit deploys
them: 100 writers straight into a client with 2 threads made its two transactions collide
on Plone's uid counter, and some POSTs were answered 500 after the last retry, a load the
kit's stack never lets reach a client (docs/storage.md, "Before and after"). wrk (Debian's) drives it, its own percentiles: per round, per (path,
connections) group, one run per variant, right after each other, in a variant order that
rotates per group and round, and the group order rotates per round, so the machine's drift
hits every variant alike. Every run has ``--warmup`` seconds of uncounted load first. Paths:
``/``, ``/Plone``, ``@json`` (``/Plone`` as plone.restapi JSON), ``blob`` (the 5 MiB
download; fewer bytes than 5 MiB per answer count as ``short_bytes``) and ``write``: a
plone.restapi POST of a Document into ``/Plone/bench-writes`` as admin through HAProxy
(``wrk_post.lua``, the Authorization header through the environment), every answer other
than 201 an error; its latency includes the wait in HAProxy's queue.

Per run: requests, req/s, MiB/s, p50/p99 (ms, wrk's), errors (connect, read, write,
timeout, status: non-2xx/3xx, for writes non-201), CPU milliseconds per request of the
client's process tree and of the database's (the zeoserver, or PostgreSQL's postmaster with
its backends; reaped children included), and the cores the rest of the machine used
meanwhile. After the last round, per variant: the documents written and the database size
(ZEO: ``Data.fs`` + the blob directory; RelStorage: ``pg_database_size`` + the client's blob
cache, or + the shared blob directory), and the conflict report of its client's event log
(``loadtests.conflicts``: ConflictErrors per class and oid, retried or failed; on zeo also
the ZEO server's resolutions that failed on a class it could not import, each a problem).
Summary: per variant, path and connections the
median req/s over the rounds (min–max) and median p50/p99; per round the ratio
RelStorage/ZEO of req/s, reported as median (min–max).

Output: progress lines, then the tables on stdout; ``<out>/storage-<YYYYmmdd-HHMMSS>/``
with ``report.json``, ``report.md`` and ``storage.png``. Every started process is stopped by
PID at the end, also after an error, Ctrl-C or SIGTERM; the work directory stays (its logs
in ``<variant>/var/log``). Exit status 0; 1 if a run had errors or short blob bodies, a POST
of the write path was answered other than 201 in the client's access log (a warm-up's, or
one still queued when wrk stopped, which no run counted), or a step failed (the report then has what was measured); 2 when wrk or PostgreSQL 15 is missing,
a port is taken, or an option is invalid.

The default run (3 variants, 5 paths, 3 connection counts, 3 rounds: 135 runs of 2 + 5 s)
took 53 minutes on 2 cores shared with other work (25 Nov 2026): 10 the builds, starts and
sites, and at 100 connections the waits (up to 60 s) until a client finished the POSTs wrk
left queued. Writes at 100 connections mostly complete none within 5 s (2 workers, ~2
POSTs/s): measure them with longer runs.
"""
import base64
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone

import numpy as np
import psutil
import requests

from loadtests import conflicts, extrabuild
from loadtests.core import (BLOB_SIZE, PATHS, ROOT, WRK_POST_SCRIPT, add_counts_argument, add_run_arguments,
                            add_stack_arguments, exits_2_when_not_ready, finish_report, format_spread,
                            load_stack, machine_busy_seconds, markdown_table, new_figure, new_parser, NotReady,
                            report_folder, require_wrk, run_wrk, save_figure, spread, spread_bars,
                            tree_cpu_seconds, wait_tree_idle)
from plonedeploy.stack import balancer as stack_balancer, supervisor as stack_supervisor
from plonedeploy.stack.errors import StackError

#: The variants: name -> (config extended, extra lines of [instance]).
VARIANTS = {
    "zeo": ("buildout.cfg", []),
    "relstorage": ("relstorage.cfg", ["relstorage-blobs = database"]),
    "relstorage-shared": ("relstorage.cfg", ["relstorage-blobs = shared-directory"]),
}
BASELINE = "zeo"
#: The path labels: core.PATHS' four reads and the write path.
WRITE = "write"
LABELS = tuple(PATHS) + (WRITE,)
WRITE_FOLDER = "bench-writes"
#: Port offsets in each variant's block of PORT_STRIDE ports. Every port of buildout.cfg's
#: [ports] is moved, also those of parts not built here, so nothing lands on the demo's.
PORT_OFFSETS = {"zeoserver": 0, "postgresql": 0, "instance": 1, "haproxy": 2, "stats": 3, "tls": 4,
                "instance-metrics": 5, "client2": 6, "uploads": 7, "client2-metrics": 8,
                "uploads-metrics": 9, "varnish": 10, "cache-fill": 11, "varnish-metrics": 12}
PORT_STRIDE = 15
PG_BIN = "/usr/lib/postgresql/15/bin"
DEFAULT_WORK_DIR = os.path.join(ROOT, "var", "storagebench")


def parse_args(argv):
    from plonedeploy.recipe.options import SERVERS

    parser = new_parser(
        "storage", "ZEO vs RelStorage on PostgreSQL side by side: req/s, p50/p99, CPU per request "
        "of client and database, database size, on stacks of its own (ports --base-port and up).")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated storages to build and compare, zeo first; of {', '.join(VARIANTS)} "
                        f"(default all; ratios are to zeo)")
    parser.add_argument("--paths", default=",".join(LABELS),
                        help=f"comma-separated paths of {', '.join(LABELS)} (default all)")
    add_counts_argument(parser, "--connections", "1,10,100", "comma-separated wrk connection counts")
    parser.add_argument("--server", default="pyruvate", choices=SERVERS,
                        help="the ZEO client's WSGI server, the same for every variant (default pyruvate)")
    add_run_arguments(parser, duration=5, warmup=2, rounds=3,
                      rounds_help="rounds of every (path, connections, variant) run, the orders rotated")
    parser.add_argument("--base-port", type=int, default=9700,
                        help=f"first port; each variant takes {PORT_STRIDE} from there on (default 9700)")
    parser.add_argument("--work-dir", default=DEFAULT_WORK_DIR,
                        help="directory of the variants' buildouts, remade every run (default var/storagebench)")
    add_stack_arguments(parser, stack_config=False)
    args = parser.parse_args(argv)
    args.variants = _choose(parser, "--variants", args.variants, VARIANTS)
    if args.variants[0] != BASELINE or len(args.variants) < 2:
        parser.error(f"--variants: expected {BASELINE} and at least one of "
                     f"{', '.join(v for v in VARIANTS if v != BASELINE)}, got {','.join(args.variants)}")
    args.paths = _choose(parser, "--paths", args.paths, LABELS)
    if args.duration < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--duration and --rounds must be >= 1, --warmup >= 0")
    if not 1024 <= args.base_port <= 65535 - PORT_STRIDE * len(args.variants):
        parser.error(f"--base-port: expected 1024..{65535 - PORT_STRIDE * len(args.variants)}, got {args.base_port}")
    args.work_dir = os.path.abspath(args.work_dir)
    return args


def _choose(parser, option, text, allowed):
    """``"a,b"`` -> ``["a", "b"]`` in the order of ``allowed``; an unknown or empty list ends
    in ``parser.error`` naming the option and the allowed values."""
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [c for c in chosen if c not in allowed]
    if not chosen or unknown:
        parser.error(f"{option}: {','.join(unknown) or repr(text)} is invalid; expected comma-separated "
                     f"values of: {', '.join(allowed)}")
    return [a for a in allowed if a in chosen]


# ----------------------------------------------------------------------------- plan

def ports(base_port, index):
    """``{[ports] key: port}`` of variant number ``index`` (0-based) from ``base_port``."""
    return {key: base_port + PORT_STRIDE * index + offset for key, offset in PORT_OFFSETS.items()}


def plan(rounds, labels, counts, variants):
    """The runs in order: ``[(round, label, connections, variant)]``.

    Groups are the (label, connections) pairs; each round runs every group once, the group
    order shifted by one per round; within a group every variant runs once, right after each
    other (so a round's ratio compares runs seconds apart), starting with a different variant
    from group to group and round to round."""
    groups = [(label, n) for n in counts for label in labels]
    runs = []
    for number in range(1, rounds + 1):
        shift = (number - 1) % len(groups)
        for position, (label, n) in enumerate(groups[shift:] + groups[:shift]):
            start = (number - 1 + position) % len(variants)
            runs += [(number, label, n, v) for v in variants[start:] + variants[:start]]
    return runs


# ----------------------------------------------------------------------------- building and running

def buildout_text(variant, work_dir, port_map, server):
    """Text of ``<work_dir>/buildout.cfg`` of ``variant``: the checkout's config for it with
    every port moved (``port_map``), the parts the stack part needs (the database, the
    ``instance`` client, an HAProxy, started for the write path only, and the stack part whose
    stack.json lists the processes; its upload lane's client ``uploads`` stays configured,
    unbuilt and unstarted (HAProxy has it DOWN), since HAProxy's body-limit rules want one
    in front of pyruvate) and ``server`` as the client's WSGI server."""
    extends, instance_lines = VARIANTS[variant]
    database = "zeoserver" if variant == BASELINE else "postgresql"
    lines = [
        extrabuild.checkout_header(os.path.join(ROOT, extends), [database, "instance", "haproxy", "stack"],
                                   f"Generated by loadtests.storagebench: the {variant} variant."),
        "[ports]",
        *(f"{key} = {port}" for key, port in port_map.items()),
        "",
        "[instance]",
        f"wsgi-server = {server}",
        *instance_lines,
        "",
        "[haproxy]",
        "backends = instance",
        "cache =",
        "",
        "[stack]",
        "cache =",
        "",
    ]
    return "\n".join(lines)


def build(variant, directory, port_map, server):
    """Stop what a previous run of ``variant`` in ``directory`` may have left running,
    remove ``directory``, write the variant's config there and run bin/buildout on it;
    returns the seconds it took. Raises RuntimeError with buildout's output when it fails."""
    if os.path.exists(os.path.join(directory, "parts", "stack", "stack.json")):
        Variant(variant, directory, port_map).stop()
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    # Under root PostgreSQL runs as "postgres", which must enter every parent directory.
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "buildout.cfg")
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(buildout_text(variant, directory, port_map, server))
    started = time.monotonic()
    result = subprocess.run([extrabuild.BUILDOUT, "-c", path], cwd=directory, capture_output=True, text=True,
                            timeout=900, check=False)
    with open(os.path.join(directory, "buildout.log"), "w", encoding="utf-8") as fp:
        fp.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"{variant}: bin/buildout -c {path} failed:\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    return time.monotonic() - started


class Variant:
    """One built variant: its directory, processes (from its stack.json: the database,
    ``instance`` and ``haproxy``), the client's URL (reads), HAProxy's (writes), the admin
    session, and the PIDs of what it started."""

    def __init__(self, name, directory, port_map):
        self.name, self.directory, self.ports = name, directory, port_map
        config = load_stack(os.path.join(directory, "parts", "stack", "stack.json"))
        self.database = "zeoserver" if name == BASELINE else "postgresql"
        keep = {self.database: 0, "instance": 1, "haproxy": 2}
        # The upload lane's client is configured but never started (buildout_text): no
        # server of ours, so waiting for every server UP waits for ``instance`` alone.
        self.config = dict(config, processes=[dict(p, stage=keep[p["name"]]) for p in config["processes"]
                                              if p["name"] in keep], upload_servers=[])
        self.url = f"http://127.0.0.1:{port_map['instance']}"
        self.write_url = f"http://127.0.0.1:{port_map['haproxy']}"
        self.metrics_url = f"http://127.0.0.1:{port_map['instance-metrics']}/metrics"
        self.session = None

    def start_process(self, name, timeout=300):
        stack_supervisor.start_stage(self.config, [p for p in self.config["processes"] if p["name"] == name], timeout)

    def pid(self, name):
        return stack_supervisor.read_pid(self.config, name)

    def stop(self):
        """Stop HAProxy, the client, then the database, then the variant's supervisord
        (SIGTERM to each process group, SIGKILL after 30 s)."""
        stack_supervisor.stop_processes(self.config)

    def create_site(self):
        """Run scripts/create_site.py with bin/instance (the database running, the client
        not yet); returns the seconds it took. Raises RuntimeError with its output."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PLONEDEPLOY_ADMIN_PASSWORD", "PLONEDEPLOY_CACHING_PROXIES")}
        started = time.monotonic()
        result = subprocess.run([os.path.join(self.directory, "bin", "instance"), "run",
                                 os.path.join(ROOT, "scripts", "create_site.py")], cwd=self.directory,
                                capture_output=True, text=True, timeout=600, check=False, env=env)
        if result.returncode != 0 or "site ready" not in result.stdout:
            raise RuntimeError(f"{self.name}: create_site.py exited {result.returncode}:\n"
                               f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return time.monotonic() - started

    def blob_cache(self):
        """The client's blob directory that is a cache (RelStorage, blobs in the database), else None."""
        if self.name != "relstorage":
            return None
        return os.path.join(self.directory, "var", "blobcache", "instance")

    def admin_session(self):
        session = requests.Session()
        with open(os.path.join(self.directory, "var", "admin-password"), encoding="utf-8") as fp:
            session.auth = ("admin", fp.read().strip())
        session.headers["Accept"] = "application/json"
        return session

    def auth_header(self):
        """The admin's ``Authorization`` header value (Basic), for wrk's environment only."""
        user, password = self.session.auth
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def prepare(self):
        """Start the database, create the site, empty a blob cache, start the client, time
        the first blob download and create the write folder. Returns ``{step: seconds}``."""
        times = {}
        started = time.monotonic()
        self.start_process(self.database)
        times["database start"] = time.monotonic() - started
        times["create_site"] = self.create_site()
        if self.blob_cache():
            # create_site.py's process wrote the blob into this cache: without it, the
            # client's first download has to fetch it from PostgreSQL, as after a restart.
            shutil.rmtree(self.blob_cache(), ignore_errors=True)
        started = time.monotonic()
        self.start_process("instance")
        times["client start"] = time.monotonic() - started
        started = time.monotonic()
        answer = requests.get(self.url + PATHS["blob"][0], timeout=120)
        times["first_blob_s"] = time.monotonic() - started
        if answer.status_code != 200 or len(answer.content) != BLOB_SIZE:
            raise RuntimeError(f"{self.name}: the blob answered {answer.status_code}, {len(answer.content)} bytes")
        self.session = self.admin_session()
        answer = self.session.post(self.url + "/Plone", json={"@type": "Folder", "id": WRITE_FOLDER,
                                                              "title": "storagebench writes"}, timeout=60)
        if answer.status_code != 201:
            raise RuntimeError(f"{self.name}: creating /Plone/{WRITE_FOLDER} answered {answer.status_code}: "
                               f"{answer.text[:300]}")
        started = time.monotonic()
        self.start_process("haproxy")
        # HAProxy has instance UP (its check: the client's /readyz), else StackError naming
        # what the check answers
        stack_balancer.wait_up(self.config, 120)
        times["haproxy up"] = time.monotonic() - started
        return {k: round(v, 2) for k, v in times.items()}

    def conflict_report(self):
        """:func:`loadtests.conflicts.read` of the client's event log (and the ZEO server's
        log on zeo): ConflictErrors per class and oid over the whole run, warm-ups included."""
        log = os.path.join(self.directory, "var", "log")
        server = [os.path.join(log, "zeoserver.log")] if self.name == BASELINE else []
        return conflicts.read([os.path.join(log, "instance.log")], [p for p in server if os.path.exists(p)])

    def write_answers(self):
        """``{status: count}`` of every POST to the write folder in the client's access log
        (``var/log/instance-access.log``): warm-ups included, and the POSTs that a server
        still had queued when wrk stopped, whose answers no run counted. Empty when there
        is no log."""
        path = os.path.join(self.directory, "var", "log", "instance-access.log")
        if not os.path.exists(path):
            return {}
        line = re.compile(rf'"POST /Plone/{WRITE_FOLDER} HTTP/[\d.]+" (\d{{3}}) ')
        with open(path, encoding="utf-8", errors="replace") as fp:
            counts = Counter(m.group(1) for m in map(line.search, fp) if m)
        return dict(sorted(counts.items()))

    def documents(self):
        """Number of Documents in the write folder (plone.restapi's ``items_total``)."""
        answer = self.session.get(f"{self.url}/Plone/{WRITE_FOLDER}", params={"b_size": 1}, timeout=120)
        answer.raise_for_status()
        return answer.json()["items_total"]

    def sizes(self):
        """``{"data_bytes", "blob_bytes", "total_bytes", "what"}``: the database's size after
        the run. ZEO: Data.fs and the blob directory; RelStorage: ``pg_database_size`` of the
        site's database and the client's blob cache (database) or the shared directory."""
        var = os.path.join(self.directory, "var")
        if self.name == BASELINE:
            data = os.path.getsize(os.path.join(var, "filestorage", "Data.fs"))
            blobs, what = directory_bytes(os.path.join(var, "blobstorage")), "Data.fs + var/blobstorage"
        else:
            out = subprocess.run([os.path.join(self.directory, "bin", "postgresql"), "psql", "-At", "-c",
                                  "SELECT pg_database_size('plone')"], cwd=self.directory, capture_output=True,
                                 text=True, timeout=60, check=True).stdout
            data = int(out.strip().splitlines()[-1])
            if self.blob_cache():
                blobs, what = directory_bytes(self.blob_cache()), "pg_database_size + blob cache"
            else:
                blobs = directory_bytes(os.path.join(var, "relstorage-blobs"))
                what = "pg_database_size + var/relstorage-blobs"
        return {"data_bytes": data, "blob_bytes": blobs, "total_bytes": data + blobs, "what": what}


def directory_bytes(path):
    """Sum of the sizes (bytes) of the files below ``path``; 0 when it does not exist."""
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def port_taken(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def leftovers(directories):
    """``[(pid, cmdline)]`` of processes whose command line names one of ``directories``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if any(d in cmdline for d in directories):
            found.append((proc.info["pid"], cmdline[:200]))
    return found


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
    ``warmup`` uncounted seconds); returns the row of the module docstring."""
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


# ----------------------------------------------------------------------------- summary and report

def cell_key(variant, label, connections):
    return f"{variant} {label} {connections}"


def summarize(runs, variants):
    """``(cells, ratios)`` from the run rows.

    ``cells``: ``{"<variant> <path> <connections>": {"rps": spread, "p50_ms", "p99_ms",
    "client_cpu_ms", "database_cpu_ms" (medians over the rounds), "errors" (sum), "runs"}}``.
    ``ratios``: ``{"<variant>/zeo <path> <connections>": spread}`` of the per-round ratios
    of req/s, for every variant but zeo; a round counts when both ran in it and zeo's
    req/s is above 0."""
    by = {}
    for r in runs:
        by.setdefault((r["variant"], r["path"], r["connections"]), {})[r["round"]] = r

    def median(rows, field):
        values = [r[field] for r in rows if r[field] is not None]
        return round(float(np.median(values)), 2) if values else None

    cells = {}
    for (variant, label, n), per_round in by.items():
        rows = list(per_round.values())
        cells[cell_key(variant, label, n)] = {
            "rps": spread([r["rps"] for r in rows]),
            **{field: median(rows, field) for field in ("p50_ms", "p99_ms", "client_cpu_ms", "database_cpu_ms")},
            "errors": sum(r["errors"] for r in rows), "runs": len(rows)}
    ratios = {}
    for (variant, label, n), per_round in by.items():
        baseline = by.get((BASELINE, label, n), {})
        if variant == BASELINE:
            continue
        values = [per_round[k]["rps"] / baseline[k]["rps"] for k in per_round
                  if k in baseline and baseline[k]["rps"] > 0]
        if values:
            ratios[f"{variant}/{BASELINE} {label} {n}"] = spread(values)
    order = {v: i for i, v in enumerate(variants)}
    ratios = dict(sorted(ratios.items(), key=lambda kv: (order.get(kv[0].split("/")[0], 99), kv[0])))
    return cells, ratios


def reads_within(ratios, fraction=0.9):
    """``{variant: bool}``: every read path's median ratio at least ``fraction`` (issue 14's
    goal: reads within 10 % of ZEO); variants without read ratios are left out."""
    verdict = {}
    for name, value in ratios.items():
        variant, label = name.split("/")[0], name.split(" ")[1]
        if label != WRITE:
            verdict[variant] = verdict.get(variant, True) and value["median"] >= fraction
    return verdict


def _or_dash(value):
    return "-" if value is None else value


def _mib(n):
    return f"{n / 2**20:,.1f}"


def to_markdown(meta, cells, ratios, sizes, found=None):
    """report.md: settings, req/s per path/connections/variant, ratios, latencies and CPU,
    database sizes, and per variant the conflict report of its client's log (``found``:
    ``{variant: loadtests.conflicts.read(...)}``)."""
    variants, labels, counts = meta["variants"], meta["paths"], meta["connections"]
    groups = [(label, n) for label in labels for n in counts]

    def cell(variant, label, n):
        return cells.get(cell_key(variant, label, n), {})

    others = [v for v in variants if v != BASELINE]
    within = reads_within(ratios)
    lines = [
        f"# ZEO vs RelStorage, {meta['started']}",
        "",
        f"`{meta['command']}`: {meta['rounds']} round(s), each run {meta['warmup_s']} s warm-up + "
        f"{meta['duration_s']} s measured (wrk, directly against the one `instance` client on "
        f"{meta['server']}, 2 workers; the writes through HAProxy's write lane, one at a time), the orders rotated per round; {meta['cores']} cores, load average "
        f"{meta['load_before']} before, {meta['load_during']} in the middle, {meta['load_after']} after; "
        f"{meta['minutes']} min.",
        "",
        "Requests/s, median over the rounds (min–max):",
        "",
        markdown_table(["path", "conns"] + variants,
                       [[label, n] + [format_spread(cell(v, label, n).get("rps"), 1) for v in variants]
                        for label, n in groups]),
        "",
        "Ratio of req/s to zeo in the same round, median (min–max); below 1: slower than ZEO:",
        "",
        markdown_table(["path", "conns"] + [f"{v}/zeo" for v in others],
                       [[label, n] + [format_spread(ratios.get(f"{v}/{BASELINE} {label} {n}"), 2) for v in others]
                        for label, n in groups]),
        "",
        "Reads within 10 % of ZEO (every read path's median ratio >= 0.90): "
        + ", ".join(f"{v} {'yes' if ok else 'no'}" for v, ok in within.items()) + ".",
        "",
        "p50 / p99 latency in ms; CPU ms per request of the client / the database (process "
        "trees); medians over the rounds; errors summed:",
        "",
        markdown_table(["path", "conns"] + variants, [[label, n] + [
            "-" if not cell(v, label, n) else
            f"{cell(v, label, n)['p50_ms']} / {cell(v, label, n)['p99_ms']} ms; "
            f"cpu {_or_dash(cell(v, label, n)['client_cpu_ms'])} / {_or_dash(cell(v, label, n)['database_cpu_ms'])}"
            + (f"; {cell(v, label, n)['errors']} errors" if cell(v, label, n)["errors"] else "")
            for v in variants] for label, n in groups]),
        "",
        "After the run (every variant started empty):",
        "",
        markdown_table(["variant", "documents written", "data MiB", "blobs MiB", "total MiB", "what",
                        "first blob download s"],
                       [[v, sizes[v].get("documents"), _mib(sizes[v]["data_bytes"]), _mib(sizes[v]["blob_bytes"]),
                         _mib(sizes[v]["total_bytes"]), sizes[v]["what"], meta["setup"][v].get("first_blob_s")]
                        for v in variants if "data_bytes" in sizes.get(v, {})]),
        "",
        "![req/s per path, connections and variant](storage.png)",
        "",
    ]
    for variant, report in (found or {}).items():
        lines += [f"Conflicts on {variant} (`python -m loadtests conflicts {variant}/var/log/instance.log"
                  + (f" --server-log {variant}/var/log/zeoserver.log" if report.get("server") is not None else "")
                  + "` in the work directory; the whole run, warm-ups included):", "",
                  conflicts.to_markdown(report, limit=10), ""]
        if report.get("write_answers"):
            lines += [f"POSTs of the write path in {variant}/var/log/instance-access.log by status (every one, "
                      f"warm-ups and POSTs queued when a run ended included): "
                      + ", ".join(f"{status}: {n}" for status, n in report["write_answers"].items()), ""]
    return "\n".join(lines)


def plot(cells, meta, path):
    """One panel per connection count: bars of req/s (log scale) per path and variant,
    min–max whiskers."""
    variants, labels, counts = meta["variants"], meta["paths"], meta["connections"]
    fig, axes = new_figure(1, len(counts), figsize=(4.5 * len(counts), 4.2))
    axes = np.atleast_1d(axes)
    for ax, n in zip(axes, counts):
        spread_bars(ax, labels, [(v, {label: cells.get(cell_key(v, label, n), {}).get("rps") for label in labels})
                                 for v in variants], capsize=2)
        ax.set_yscale("log")
        ax.set_title(f"{n} connection{'s' if n > 1 else ''}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("requests/s (median, min-max; log)")
    axes[0].legend(fontsize="small")
    save_figure(fig, path)


# ----------------------------------------------------------------------------- main

def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@exits_2_when_not_ready("storage")
def main(argv=None):
    args = parse_args(argv)
    require_wrk()
    if any(v != BASELINE for v in args.variants) and not os.access(os.path.join(PG_BIN, "postgres"), os.X_OK):
        raise NotReady(f"{PG_BIN}/postgres missing: install Debian's postgresql 15 (make system)")
    port_maps = {v: ports(args.base_port, i) for i, v in enumerate(args.variants)}
    # The processes started here listen on these (zeoserver and postgresql share a port).
    taken = sorted({p[key] for p in port_maps.values() for key in ("zeoserver", "instance") if port_taken(p[key])})
    if taken:
        raise NotReady(f"ports in use: {taken}; choose another --base-port")
    signal.signal(signal.SIGTERM, _terminate)
    started, clock = datetime.now(timezone.utc), time.monotonic()
    meta = {"started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["python -m loadtests storage", *(argv if argv is not None else sys.argv[1:])]),
            "variants": args.variants, "paths": args.paths, "connections": args.connections,
            "server": args.server, "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds,
            "base_port": args.base_port, "work_dir": args.work_dir, "cores": psutil.cpu_count(),
            "load_before": [round(x, 2) for x in os.getloadavg()], "load_during": None, "setup": {}}
    os.makedirs(args.work_dir, exist_ok=True)
    os.chmod(args.work_dir, 0o755)
    variants, runs, problems, sizes, found = {}, [], [], {}, {}
    directories = [os.path.join(args.work_dir, v) for v in args.variants]
    try:
        for name, directory in zip(args.variants, directories):
            took = build(name, directory, port_maps[name], args.server)
            variants[name] = Variant(name, directory, port_maps[name])
            setup = variants[name].prepare()
            meta["setup"][name] = {"build_s": round(took, 1), **setup}
            print(f"{name}: built in {took:.0f} s, ready: {setup}", flush=True)
        todo = plan(args.rounds, args.paths, args.connections, args.variants)
        print(f"{len(todo)} wrk runs of {args.warmup} + {args.duration} s (about "
              f"{len(todo) * (args.warmup + args.duration + 1.5) / 60:.0f} min)", flush=True)
        for done, (number, label, n, name) in enumerate(todo, 1):
            row = measure(variants[name], label, n, args.duration, args.warmup, number)
            runs.append(row)
            if done == len(todo) // 2:
                meta["load_during"] = [round(x, 2) for x in os.getloadavg()]
            print(f"[{done}/{len(todo)}] round {number} {label:6} {n:4} conns {name:17} {row['rps']:8.1f} req/s "
                  f"p50 {row['p50_ms']} p99 {row['p99_ms']} ms, cpu/req client {row['client_cpu_ms']} "
                  f"db {row['database_cpu_ms']} ms, errors {row['errors']}, other cores {row['other_cores']}",
                  flush=True)
            if row["errors"] or row.get("short_bytes") or not row["requests"]:
                problems.append(f"round {number} {name} {label} {n}: {row['requests']} requests, "
                                f"errors {row['error_kinds']}" + (", short blob bodies" if row.get("short_bytes") else ""))
        for name, variant in variants.items():
            sizes[name] = {"documents": variant.documents(), **variant.sizes()}
    except (RuntimeError, OSError, subprocess.SubprocessError, requests.RequestException, StackError,
            KeyboardInterrupt) as exc:
        problems.append(f"stopped: {exc!r}")
        print(f"storage: stopped: {exc!r}", file=sys.stderr, flush=True)
    finally:
        for variant in reversed(list(variants.values())):
            variant.stop()
        left = leftovers(directories)
        meta["leftovers"] = left
        if left:
            problems.append(f"processes left running: {left}")
    for name, variant in variants.items():  # also after a stop: what the logs have so far
        try:
            found[name] = variant.conflict_report()
        except OSError as exc:
            problems.append(f"{name}: no conflict report: {exc}")
            continue
        answers = found[name]["write_answers"] = variant.write_answers()
        failed = sum(n for status, n in answers.items() if status != "201")
        if failed:
            problems.append(f"{name}: {failed} of {sum(answers.values())} POSTs of the write path answered "
                            f"other than 201 in the client's access log (warm-ups and POSTs queued when a "
                            f"run ended included): {answers}")
        if found[name]["server"] and found[name]["server"]["badclass"]:
            problems.append(f"{name}: the ZEO server failed {found[name]['server']['badclass']} conflict "
                            f"resolution(s) on a class it could not import (BadClass)")
    meta["load_after"] = [round(x, 2) for x in os.getloadavg()]
    meta["minutes"] = round((time.monotonic() - clock) / 60, 1)
    meta["problems"] = problems
    cells, ratios = summarize(runs, args.variants)
    folder = report_folder(args.out, "storage")
    text = to_markdown(meta, cells, ratios, sizes, found)
    return finish_report(folder, {"meta": meta, "cells": cells, "ratios": ratios, "sizes": sizes,
                                  "conflicts": found, "runs": runs},
                         text, [("storage.png", lambda path: plot(cells, meta, path))] if cells else [], problems)


if __name__ == "__main__":
    sys.exit(main())
