"""ZEO vs RelStorage on PostgreSQL, side by side in one run (issue 14;
docs/results.md#zeo-vs-relstorage-under-load).

    python -m loadtests storage [--variants zeo,relstorage,relstorage-shared,rs-explicit,...]
        [--paths /,/Plone,@json,blob,write] [--connections 1,10,100] [--server pyruvate]
        [--duration 5] [--warmup 2] [--rounds 3] [--base-port 9700] [--work-dir var/storagebench]
        [--per-request N]

Needs no running stack: it builds and starts its own, one per variant, each a buildout of
its own in ``<work-dir>/<variant>`` (made afresh every run: an empty database) on ports of
its own (``--base-port`` + 15 per variant), with the checkout's eggs:

- ``zeo``: ``buildout.cfg``'s zeoserver and its ``instance`` client (Data.fs and the blob
  directory in ``<variant>/var``);
- ``relstorage``: ``relstorage.cfg``'s local PostgreSQL 15 (the ``[postgresql]`` part) and
  the same client with ``storage = relstorage``, ``relstorage-blobs = database`` (blobs in
  PostgreSQL, each client with a blob cache);
- ``relstorage-shared``: the same with ``relstorage-blobs = shared-directory`` (blobs as
  files in one directory, none in PostgreSQL);
- the RelStorage tuning of issue 32 (not run by default; ``loadtests.storage.plan.VARIANTS``
  has their lines): ``rs-explicit`` (``transaction-mode = explicit``), ``rs-cache-100mb``
  (``relstorage-cache-local-mb = 100``), ``rs-cache-dir`` (``relstorage-cache-local-dir``),
  ``rs-blob-cache-1gb`` (``relstorage-blob-cache-size = 1GB``), ``rs-pg-tuned`` (the
  ``[postgresql]`` part's ``settings``: shared_buffers, work_mem, plan_cache_mode, jit) and
  ``rs-tuned`` (explicit mode, both caches and the PostgreSQL settings together).

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
kit's stack never lets reach a client (docs/results.md, "Conflicts before and after"). wrk
(Debian's) drives it, its own percentiles: per round, per (path, connections) group, one run
per variant, right after each other, in a variant order that rotates per group and round,
and the group order rotates per round, so the machine's drift hits every variant alike. Every
run has ``--warmup`` seconds of uncounted load first. Paths: ``/``, ``/Plone``, ``@json``
(``/Plone`` as plone.restapi JSON), ``blob`` (the 5 MiB download; fewer bytes than 5 MiB per
answer count as ``short_bytes``) and ``write``: a plone.restapi POST of a Document into
``/Plone/bench-writes`` as admin through HAProxy (``wrk_post.lua``, the Authorization header
through the environment), every answer other than 201 an error; its latency includes the wait in
HAProxy's queue.

Per run: requests, req/s, MiB/s, p50/p99 (ms, wrk's), errors (connect, read, write,
timeout, status: non-2xx/3xx, for writes non-201), CPU milliseconds per request of the
client's process tree and of the database's (the zeoserver, or PostgreSQL's postmaster with
its backends; reaped children included), and the cores the rest of the machine used
meanwhile. After the last round, per variant: the documents written and the database size
(ZEO: ``Data.fs`` + the blob directory; RelStorage: ``pg_database_size`` + the client's blob
cache, or + the shared blob directory), and the conflict report of its client's event log
(``loadtests.storage.conflicts``: ConflictErrors per class and oid, retried or failed; on zeo also
the ZEO server's resolutions that failed on a class it could not import, each a problem).
Summary: per variant, path and connections the
median req/s over the rounds (min–max) and median p50/p99; per round the ratio
RelStorage/ZEO of req/s, reported as median (min–max).

Output: progress lines, then the tables on stdout; ``<out>/storage-<YYYYmmdd-HHMMSS>/``
with ``report.json``, ``report.md`` and ``storage.png``. Every started process is stopped by
PID at the end, also after an error, Ctrl-C or SIGTERM; the work directory stays (its logs
in ``<variant>/var/log``). Exit status 0; 1 if a run had errors or short blob bodies, a POST
of the write path was answered other than 201 in the client's access log (a warm-up's, or
one still queued when wrk stopped, which no run counted), or a step failed (the report then
has what was measured); 2 when wrk or PostgreSQL 15 is missing, a port is taken, or an option
is invalid.

With ``--per-request N`` the same stacks get no wrk runs: per round, read path and variant
(the same order), N requests one after the other, and per request the SQL statements
PostgreSQL ran, the objects the client loaded from its storage, the CPU ms of client and
database and the wall ms (``loadtests.storage.perrequest``; ``--connections``, ``--duration``
and ``--warmup`` do not apply). Counts do not move with the machine's load as req/s do.

The default run (3 variants, 5 paths, 3 connection counts, 3 rounds: 135 runs of 2 + 5 s)
took 53 minutes on 2 cores shared with other work (25 Nov 2026): 10 the builds, starts and
sites, and at 100 connections the waits (up to 60 s) until a client finished the POSTs wrk
left queued. Writes at 100 connections mostly complete none within 5 s (2 workers, ~2
POSTs/s): measure them with longer runs.

The parts are in loadtests.storage: ``plan`` (variants, ports, the order of the runs),
``variant`` (building, starting and stopping one variant's stack), ``measure`` (one wrk run
against it), ``summary`` (cells, ratios, report.md and the plot), ``perrequest`` (the
``--per-request`` counts); ``conflicts`` is the conflict report. This module holds the options and ``main``.
"""
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import psutil
import requests

from loadtests.core.cli import (add_counts_argument, add_run_arguments, add_stack_arguments, exits_2_when_not_ready,
                                new_parser)
from loadtests.core.reports import finish_report, report_folder
from loadtests.core.stack import NotReady
from loadtests.core.wrk import require_wrk
from loadtests.storage.measure import measure
from loadtests.storage import perrequest
from loadtests.storage.plan import (BASELINE, DEFAULT_VARIANTS, DEFAULT_WORK_DIR, LABELS, PG_BIN, PORT_STRIDE, VARIANTS,
                                   WRITE, plan, ports)
from loadtests.storage.summary import plot, summarize, to_markdown
from loadtests.storage.variant import Variant, build, leftovers, port_taken
from plonedeploy.stack.errors import StackError


def parse_args(argv):
    from plonedeploy.stack.rules import SERVERS

    parser = new_parser(
        "storage", "ZEO vs RelStorage on PostgreSQL side by side: req/s, p50/p99, CPU per request "
        "of client and database, database size, on stacks of its own (ports --base-port and up).")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated storages to build and compare, zeo first; of {', '.join(VARIANTS)} "
                        f"(default {','.join(DEFAULT_VARIANTS)}; ratios are to zeo)")
    parser.add_argument("--paths", default=",".join(LABELS),
                        help=f"comma-separated paths of {', '.join(LABELS)} (default all)")
    add_counts_argument(parser, "--connections", "1,10,100", "comma-separated wrk connection counts")
    parser.add_argument("--server", default="pyruvate", choices=SERVERS,
                        help="the ZEO client's WSGI server, the same for every variant (default pyruvate)")
    add_run_arguments(parser, duration=5, warmup=2, rounds=3,
                      rounds_help="rounds of every (path, connections, variant) run, the orders rotated")
    parser.add_argument("--per-request", type=int, default=0, metavar="N",
                        help="instead of wrk runs: N sequential requests per round, path and variant, counted "
                        "per request (SQL statements, ZODB loads, CPU ms; loadtests.storage.perrequest); "
                        "read paths only (default 0: wrk runs)")
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
    if args.per_request < 0 or (args.per_request and WRITE in args.paths):
        parser.error(f"--per-request: expected a count >= 0 of requests on read paths only, got "
                     f"{args.per_request} with --paths {','.join(args.paths)}")
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
        if args.per_request:
            perrequest.run(list(variants.values()), args.rounds, args.paths, args.per_request, runs)
        else:
            todo = plan(args.rounds, args.paths, args.connections, args.variants)
            print(f"{len(todo)} wrk runs of {args.warmup} + {args.duration} s (about "
                  f"{len(todo) * (args.warmup + args.duration + 1.5) / 60:.0f} min)", flush=True)
            for done, (number, label, n, name) in enumerate(todo, 1):
                row = measure(variants[name], label, n, args.duration, args.warmup, number)
                runs.append(row)
                if done == len(todo) // 2:
                    meta["load_during"] = [round(x, 2) for x in os.getloadavg()]
                print(f"[{done}/{len(todo)}] round {number} {label:6} {n:4} conns {name:17} "
                      f"{row['rps']:8.1f} req/s "
                      f"p50 {row['p50_ms']} p99 {row['p99_ms']} ms, cpu/req client {row['client_cpu_ms']} "
                      f"db {row['database_cpu_ms']} ms, errors {row['errors']}, other cores {row['other_cores']}",
                      flush=True)
                if row["errors"] or row.get("short_bytes") or not row["requests"]:
                    problems.append(f"round {number} {name} {label} {n}: {row['requests']} requests, "
                                    f"errors {row['error_kinds']}"
                                    + (", short blob bodies" if row.get("short_bytes") else ""))
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
    folder = report_folder(args.out, "storage")
    if args.per_request:
        meta.update(requests=args.per_request)
        cells = perrequest.summarize(runs)
        return finish_report(folder, {"meta": meta, "cells": cells, "conflicts": found, "runs": runs},
                             perrequest.to_markdown(meta, cells, runs), [], problems)
    cells, ratios = summarize(runs, args.variants)
    text = to_markdown(meta, cells, ratios, sizes, found)
    return finish_report(folder, {"meta": meta, "cells": cells, "ratios": ratios, "sizes": sizes,
                                  "conflicts": found, "runs": runs},
                         text, [("storage.png", lambda path: plot(cells, meta, path))] if cells else [], problems)


if __name__ == "__main__":
    sys.exit(main())
