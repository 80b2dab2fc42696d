"""The kit's headline figures, re-measured side by side in one run, with their spread.

    python -m loadtests headline [--connections 4] [--duration 8] [--rounds 3] [--no-off] [--no-copy]
                                 [--variant NAME ...] [--cache] [--logged-in] [--paths /,/Plone,@json,blob]

Against the running stack (``make start``): in every round, in an order rotated from round
to round, one wrk run of ``--duration`` seconds with ``--connections`` connections on
each of the four paths (``/``, ``/Plone``, ``@json``, the 5 MiB blob) against

- ``pyruvate``: the stack's pyruvate client directly (its HTTP port),
- ``waitress``: the stack's waitress client directly,
- ``haproxy``: the stack's HAProxy pool (``leastconn`` over both),

and also against ``pyruvate-off`` and ``waitress-off``: the same two clients with Zope's
stock pipeline, ``blob-sendfile = off`` and no ``metrics-address`` (``translogger
httpexceptions``, without the kit's ``blobsendfile`` and ``metrics`` filters;
:mod:`loadtests.headline.offclients`, built in ``var/headline``, on the ports after the
stack's clients; the stack's two clients are restarted first, drained, so that both sides
start alike, unless ``--no-restart``), unless ``--no-off``; and on the blob path against HAProxy variants
(:mod:`loadtests.headline.variants`): HAProxys of the stack's config
(:class:`loadtests.core.balancers.TemporaryBalancer`, two free ports each) with other
command-line options or ``global`` lines, ``haproxy-<variant>``. By default ``haproxy-copy``,
started with ``-dS``, so that it copies response bodies through its buffers instead of
splicing them (the template's ``option splice-response``), unless ``--no-copy``; ``--variant
NAME`` (repeatable; ``all``) adds others: ``pipesize-512k``, ``pipesize-1m``, ``bufs-1m``,
``bufs-4m``, ``nbthread-1``, ``nbthread-1-copy``, each with ``haproxy-same``, the unchanged
config in a temporary HAProxy, their baseline; ``pyruvate-alone``, the config with only the
pool's pyruvate client as server, against that client directly (the balancer's own cost).
With ``--cache``, on the blob also ``varnish`` (the stack's varnish directly, plain HTTP) and
``haproxy-tls`` (the stack's HTTPS frontend, which sends GET and HEAD to varnish: the cache
tier); plone.app.caching lets varnish keep the blob (``plone.content.file``, moderateCaching,
``s-maxage=86400``), so after the warm-up they serve hits. Ratios ``varnish/best direct blob``
and ``haproxy-tls/best direct blob``.
Every target and path first gets 2 s of uncounted load (caches, ZODB connections); the
logged-in class 4 s of 2 editors after their logins.

With ``--logged-in`` every target of the four paths (not the HAProxy variants) also gets the
path class ``logged-in``: not wrk but the locustfile's logged-in shape
(:mod:`loadtests.core.locustrun`, one Locust process), ``--connections`` editors who log in
during a 3 s warm-up that is not counted and then, each in a closed loop, view the front page
as a Member, list the folder contents, open the edit form of a document of their own and save
it, every answer checked (a failed check counts as an error). Its req/s counts those four
requests together (one editor's round of them is four requests).

Figures per target and path: req/s (median over the rounds, min-max), p50/p99 in ms
(median), errors (wrk's socket errors and non-2xx/3xx answers, summed). Ratios, per round
and then median (min-max): pyruvate/waitress directly on each path, the kit's pipeline
against the stock one per server and path (``<server> kit/stock <path>``; on the blob that
is blob-sendfile on/off), the pool's blob with splicing against copying (``haproxy
blob splice/copy``), each other variant against the unchanged config's temporary HAProxy
(``haproxy-<variant>/haproxy-same blob``) and that one against the pool (``haproxy-same/haproxy blob``),
HAProxy over pyruvate alone against pyruvate directly (``haproxy-pyruvate-alone/pyruvate blob``)
and the pool against the faster client's direct figure of the same round
(``haproxy/best direct blob``; also ``haproxy-maxconn-4``, ``haproxy-nbthread-1-maxconn-4``
and, with ``--cache``, the cache tier), and with the off clients ``kit/hand-built <path>``: the kit's
default client (pyruvate, the kit's pipeline) against ``waitress-off``, the nearest the kit
builds to a hand-built default client (the backend image's waitress with ``threads = 2``,
Zope's stock pipeline; the stack's waitress client has 2 threads and no tuning beyond the
pipeline). The run-to-run spread of the same cell is the noise a
difference has to beat (about 25 % on these shared machines).

CPU per request, per run (``cpu_ms`` of each row of report.json, medians per target and path in
report.md): the user + system CPU milliseconds per request (psutil, over the counted run) of
the stack's HAProxy (``haproxy``), each variant's HAProxy (its target name), the stack's ZEO
clients of the pool (their part names), the off clients (``<server>-off``), the ZEO server,
varnish's serving child, wrk (its reaped CPU), ``kernel`` (the kernel's threads, ksoftirqd's
network work among them), ``others`` (every other process that ran throughout the run: other
users, the stack's other parts, this process), ``rest`` (busy time none of these account for:
processes that began or ended within the run) and ``machine`` (every core's busy time);
``busy_cores``: the machine's busy cores over the run (0 .. cores). A process idle in a run
(a direct client HAProxy only health-checks, the other client) shows its few idle
milliseconds.

``spliced_mib`` in the report: the MiB each HAProxy sent through kernel pipes during the run
(``haproxy_process_spliced_bytes_out_total`` of its Prometheus exporter): above 0 for
``haproxy`` when the template's splicing is in effect (and for the variants without ``-dS``),
0 for ``haproxy-copy``.

Output: the tables on stdout and ``<out>/headline-<YYYYmmdd-HHMMSS>/`` with
``report.json``, ``report.md`` (the tables docs/results.md#headline-figures-make-headline
embeds) and ``headline.png``. Exit status 0; 1 if any run had errors or short blob bodies; 2 when the
stack is not running, wrk is missing, the pool lacks a pyruvate or a waitress client, or with
``logged-in`` the editors cannot log in through the stack's HAProxy (before anything is built).

The default run (3 rounds of 21 runs of 8 s, plus warm-up, the off clients' build and
start, the copy's start): about 10 minutes on 2 cores (3 rounds of 15 runs took 7.6
minutes on 28 Nov 2026; docs/results.md#headline-figures-make-headline). Each further variant
adds one run per round (``--variant all``: 27 runs per round, about 13 minutes).
"""
import os
import re
import sys
import time
from datetime import datetime, timezone

import numpy as np
import psutil
import requests

from loadtests.core import extrabuild
from loadtests.core.balancers import BalancerError
from loadtests.core.cli import (add_buildout_config_argument, add_run_arguments, add_stack_arguments,
                                exits_2_when_not_ready, name_list, new_parser)
from loadtests.core.reports import finish_report, markdown_table, new_figure, report_folder, save_figure, spread_bars
from loadtests.core.locustrun import editors_refused, run_locust_shape
from loadtests.core.procs import cpu_during, cpu_ms_per_request
from loadtests.core.stack import (BLOB_SIZE, PATHS, ROOT, check_servers_up, client_urls, default_buildout_config,
                                  editor_password_missing, load_stack, stack_pids)
from loadtests.core.stats import format_spread, spread
from loadtests.core.wrk import require_wrk, run_wrk
from loadtests.headline import offclients, variants
from loadtests.loggedin import LOGGED_IN

WORK_DIR = os.path.join(ROOT, "var", "headline")
#: The servers compared directly; the recipe's A/B pair.
SERVERS = ("pyruvate", "waitress")
TARGETS = SERVERS + ("haproxy",)
#: ``--cache``'s targets on the blob: the stack's varnish directly (plain HTTP), and the stack's
#: HTTPS frontend, which sends GET and HEAD to varnish (haproxy.cfg.j2's ``to_cache``).
CACHE_TARGETS = ("varnish", "haproxy-tls")
#: The fronts of both clients compared with the faster client directly on the blob (``<front>/best
#: direct blob``, issue 32's goal): the stack's pool, the pool with 4 requests per server (and one
#: HAProxy thread), the cache tier.
BEST_DIRECT_FRONTS = ("haproxy", variants.target("maxconn-4"), variants.target("nbthread-1-maxconn-4")) + CACHE_TARGETS
#: The CPU figures of a run beside its processes' (:func:`cpu_figures`), the CPU table's last columns.
CPU_TOTALS = ("wrk", "kernel", "others", "rest", "machine")
OFF = tuple(f"{s}-off" for s in SERVERS)
#: The stack's HAProxy config run with ``-dS`` (no kernel splicing), on the blob path: the default variant.
COPY = variants.target("copy")
#: Every path label a run can have, in table order: wrk's four, then the opt-in Locust class.
ALL_PATHS = tuple(PATHS) + (LOGGED_IN,)


def _paths(labels):
    """The labels of ALL_PATHS among ``labels``, in table order."""
    labels = set(labels)
    return [p for p in ALL_PATHS if p in labels]


def parse_args(argv):
    parser = new_parser(
        "headline", "The docs' headline figures in one run: pyruvate vs waitress directly and "
        "through HAProxy on the four paths, the kit's pipeline against Zope's stock one, each with its "
        "spread over rounds.")
    parser.add_argument("--connections", type=int, default=4,
                        help="wrk connections of every run (default 4: twice the pool's 2 slots per "
                        "server, the figure docs/results.md#headline-figures-make-headline quotes)")
    add_run_arguments(parser, duration=8, rounds=3)
    parser.add_argument("--no-off", action="store_true",
                        help="leave out the clients with Zope's stock pipeline (no extra build)")
    parser.add_argument("--no-restart", action="store_true",
                        help="do not restart the stack's pyruvate and waitress clients (drained, one at a time) "
                        "before the -off clients start; by default both sides start alike")
    parser.add_argument("--no-copy", action="store_true",
                        help=f"leave out {COPY}, the stack's HAProxy config without kernel splicing")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME",
                        help="also measure the blob through this HAProxy variant, haproxy-NAME (repeatable): "
                        + "; ".join(f"{name} = {variants.describe(name)}" for name in variants.VARIANTS)
                        + f"; {variants.ALL} = every one. copy is measured unless --no-copy")
    parser.add_argument("--cache", action="store_true",
                        help="also measure the blob through the stack's cache tier: varnish directly (plain HTTP, "
                        "target varnish) and the stack's HTTPS frontend, which sends GETs to varnish (haproxy-tls); "
                        "ratios against the faster client directly (needs a stack with varnish)")
    parser.add_argument("--logged-in", action="store_true",
                        help="also measure the path class logged-in on every target but the variants: "
                        "--connections editors (Locust's logged-in shape: front page as a Member, folder "
                        "contents, edit form, save; bodies checked), their logins in an uncounted 3 s warm-up; "
                        "needs $PLONEDEPLOY_EDITOR_PASSWORD or var/editor-password (PLONEDEPLOY_EDITORS=on make site)")
    parser.add_argument("--paths", type=name_list(parser, "--paths", ALL_PATHS),
                        help=f"comma-separated path labels to measure, from {', '.join(ALL_PATHS)} (default "
                        f"{','.join(PATHS)}; {LOGGED_IN} as with --logged-in)")
    add_buildout_config_argument(parser, "the off clients' buildout in var/headline")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    if args.connections < 1 or args.duration < 1 or args.rounds < 1:
        parser.error("--connections, --duration and --rounds must be >= 1")
    args.paths = _paths((args.paths or list(PATHS)) + ([LOGGED_IN] if args.logged_in else []))
    args.logged_in = LOGGED_IN in args.paths
    if args.logged_in and (missing := editor_password_missing()):
        parser.error(f"--logged-in: {missing}")
    if args.cache and "blob" not in args.paths:
        parser.error(f"--cache: the cache tier is measured on the blob only, and --paths {','.join(args.paths)} "
                     "leaves it out")
    if args.variant and "blob" not in args.paths:
        parser.error(f"--variant: the HAProxy variants run on the blob only, and --paths {','.join(args.paths)} "
                     "leaves it out")
    try:
        # The variants differ from the stack's HAProxy on the blob only.
        args.variants = variants.select(args.variant, args.no_copy) if "blob" in args.paths else []
    except ValueError as exc:
        parser.error(str(exc))
    return args


def targets(config):
    """``(urls, clients)`` of the stack: ``urls`` ``{target: base URL}`` for ``pyruvate`` and
    ``waitress`` (the first pool client of each kind, its own HTTP address) and ``haproxy``
    (the frontend); ``clients`` ``{server: client part}``. Raises LookupError naming what is
    missing."""
    kinds = config["server_kinds"]
    clients = {}
    for server in SERVERS:
        names = [n for n in config["servers"] if kinds.get(n) == server]
        if not names:
            raise LookupError(f"no {server} client in the HAProxy pool ({kinds}): headline compares "
                              f"{' and '.join(SERVERS)}")
        clients[server] = names[0]
    urls = {server: url for server, url in zip(clients, client_urls(config, clients.values()).values())}
    urls["haproxy"] = config["frontend_url"].rstrip("/")
    return urls, clients


def start_off_clients(config, clients, urls, buildout_config=None, restart=True):
    """Build and start the ``-off`` clients (Zope's stock pipeline, :mod:`loadtests.headline.offclients`)
    beside the stack's two compared clients ``clients`` (``{server: part}``), and add their
    URLs to ``urls`` as ``<server>-off``. Returns ``(off_config, processes)``: their extra stack
    config (for :func:`loadtests.core.extrabuild.stop`) and ``{"<server>-off": psutil.Process}``.

    With ``restart`` (the default; ``--no-restart``) the stack's two clients are first restarted
    one at a time, drained in HAProxy (``bin/stack restart``'s steps,
    :func:`plonedeploy.stack.balancer.restart_client`): the -off clients start fresh, and a
    kit client that had served minutes of load more than its stock twin measured 14 % slower
    on ``/Plone`` in one run and level in the next once both started alike (docs/results.md,
    28 Nov 2026, "The same commands on a quiet machine"). Raises StackError, RuntimeError or
    OSError from the restart, the build or the start.
    """
    from plonedeploy.stack.balancer import restart_client

    names = [clients[s] for s in SERVERS]
    if restart:
        by_name = {proc["name"]: proc for proc in config["processes"]}
        for name in names:
            restart_client(config, by_name[name])
    ports = offclients.ports({clients[s]: urls[s] for s in SERVERS}, len(config["servers"]))
    offclients.build(WORK_DIR, buildout_config or default_buildout_config(), names, ports,
                     tool="loadtests.headline")
    off_config = offclients.stack_config(WORK_DIR, names, ports)
    started = extrabuild.start(off_config)
    try:
        # offclients names each part's copy "<part>-off".
        processes = {f"{server}-off": started[f"{clients[server]}-off"] for server in SERVERS}
    except BaseException:
        # The caller gets no off_config to stop them with: stop them here.
        extrabuild.stop(off_config)
        raise
    for server in SERVERS:
        urls[f"{server}-off"] = f"http://127.0.0.1:{ports[clients[server]]}"
    return off_config, processes


def measured_processes(config, off_processes=None, balancers=None):
    """``{name: psutil.Process}`` whose CPU every run counts: the stack's HAProxy
    (``haproxy``), each variant's (``balancers``: ``{target: TemporaryBalancer}``, by target),
    the pool's ZEO clients (their part names), the off clients (``off_processes``, by target),
    varnish's serving child (``varnish``) and the ZEO server (stack.json's ``zeoserver``); those
    not running are left out."""
    running = stack_pids(config)
    procs = {name: running[name] for name in ["haproxy"] if name in running}
    procs.update({target: balancer.process for target, balancer in (balancers or {}).items()})
    procs.update({name: running[name] for name in config["servers"] if name in running})
    procs.update(off_processes or {})
    # varnishd's manager only forks and watches the child that serves (its cache process).
    workers = running["varnish"].children() if "varnish" in running else []
    procs.update({"varnish": workers[0]} if workers else {})
    zeo = config.get("zeoserver") or "zeoserver"
    procs.update({zeo: running[zeo]} if zeo in running else {})
    return procs


def cpu_figures(requests, used, wrk_cpu=None):
    """A run's CPU figures: ``{"cpu_ms": {name: CPU ms per request}, "busy_cores": float}``.

    ``used``: the run's :data:`loadtests.core.procs.CpuUse` (``{name: CPU seconds}`` of the
    measured processes, the other processes', the machine's busy seconds, the run's seconds);
    ``wrk_cpu``: wrk's CPU seconds (None for a Locust run). ``cpu_ms`` adds ``wrk``, ``kernel``
    (the kernel's threads: ksoftirqd's share of the loopback traffic among them), ``others``
    (every other process that ran throughout: other users, the stack's other parts, this
    tool), ``rest`` (busy time none of these account for: processes that started or ended
    within the run, steal; at least 0) and ``machine`` (all busy time)."""
    cpu = dict(used.cpu, **({"wrk": wrk_cpu} if wrk_cpu is not None else {}))
    cpu["kernel"] = used.kernel
    cpu["others"] = used.others
    cpu["rest"] = max(used.busy - sum(cpu.values()), 0.0)
    cpu["machine"] = used.busy
    return {"cpu_ms": cpu_ms_per_request(cpu, requests),
            "busy_cores": round(used.busy / used.wall, 2) if used.wall > 0 else None}


def spliced_bytes(metrics_url):
    """Bytes the HAProxy at ``metrics_url`` (its Prometheus exporter) has sent through kernel
    pipes since it started: ``haproxy_process_spliced_bytes_out_total``, 0 when it never
    spliced. Raises requests.RequestException, or LookupError when the metric is missing."""
    text = requests.get(metrics_url, timeout=5).text
    found = re.search(r"^haproxy_process_spliced_bytes_out_total (\S+)$", text, re.MULTILINE)
    if not found:
        raise LookupError(f"{metrics_url}: no haproxy_process_spliced_bytes_out_total")
    return int(float(found.group(1)))


def plan(rounds, with_off, variant_names=(), paths=tuple(PATHS), with_cache=False):
    """The runs in order: ``[(round, target, path label)]`` on each of ``paths`` (labels of
    ALL_PATHS, the path class ``logged-in`` among them; the HAProxy variants never get it),
    with the off clients on every path if ``with_off``, each of ``variant_names``
    (:data:`variants.VARIANTS`) on the blob, with ``with_cache`` the CACHE_TARGETS on the blob;
    the order of the (target, path) pairs rotates by one per round so no pair always runs first
    (a rotation keeps each pair after the same one, except in the round it runs first: a
    target disturbed by its predecessor stays so; the ratios are within a round)."""
    paths = _paths(paths)
    cells = [(t, p) for p in paths for t in TARGETS + (OFF if with_off else ())]
    cells += [(variants.target(name), "blob") for name in variant_names]
    cells += [(t, "blob") for t in CACHE_TARGETS if with_cache and "blob" in paths]
    runs = []
    for number in range(1, rounds + 1):
        shift = (number - 1) % len(cells)
        runs += [(number, t, p) for t, p in cells[shift:] + cells[:shift]]
    return runs


def measure(url, label, connections, duration):
    """One wrk run of ``label`` (a key of ``loadtests.core.stack.PATHS``) against ``url``, or for
    ``logged-in`` one Locust run (:func:`run_locust_shape`, ``connections`` editors); a row
    dict: requests, rps (requests/s), mib_s (MiB/s of bodies), p50_ms, p99_ms, errors, wrk_cpu_s
    (wrk's CPU seconds; not for logged-in) and, for the blob, short_bytes (fewer bytes than
    requests x 5 MiB)."""
    if label == LOGGED_IN:
        return run_locust_shape(url, f"{LOGGED_IN}=1", connections, duration)
    path, accept = PATHS[label]
    out = run_wrk(url + path, connections, duration, threads=min(2, connections), accept=accept)
    seconds = out["duration_us"] / 1e6
    row = {"requests": out["requests"], "rps": round(out["requests"] / seconds, 1),
           "mib_s": round(out["bytes"] / seconds / 2**20, 1),
           "p50_ms": round(out["latency_us"]["p50"] / 1000, 1), "p99_ms": round(out["latency_us"]["p99"] / 1000, 1),
           "errors": sum(out["errors"].values()), "wrk_cpu_s": out["cpu_s"]}
    if label == "blob":
        row["short_bytes"] = out["bytes"] < out["requests"] * BLOB_SIZE
    return row


def summarize(runs):
    """``(cells, ratios)`` from the run rows (each with round, target, path, rps, p50_ms,
    p99_ms, errors). ``cells``: ``{"target path": {"rps": spread, "p50_ms", "p99_ms"
    (medians), "errors" (sum), "runs"}}``; ``ratios``: ``{name: spread}`` of per-round
    ratios, for each path ``pyruvate/waitress <path>``, with the off clients ``<server>
    kit/stock <path>`` and ``kit/hand-built <path>`` (pyruvate against waitress-off), with
    haproxy-copy ``haproxy blob splice/copy``, with another HAProxy variant
    ``haproxy-<variant>/haproxy-same blob`` (:func:`variants.ratio`), and ``haproxy/best
    direct blob`` (the pool against the faster of pyruvate and waitress in that round). A ratio
    needs both runs of its round."""
    by = {}
    for r in runs:
        by.setdefault((r["target"], r["path"]), {})[r["round"]] = r
    cells = {}
    for (target, path), rows in by.items():
        rows = list(rows.values())
        cells[f"{target} {path}"] = {
            "rps": spread([r["rps"] for r in rows]),
            "p50_ms": round(float(np.median([r["p50_ms"] for r in rows])), 1),
            "p99_ms": round(float(np.median([r["p99_ms"] for r in rows])), 1),
            "errors": sum(r["errors"] for r in rows), "runs": len(rows)}
        if any("cpu_ms" in r for r in rows):
            cells[f"{target} {path}"]["cpu_ms"] = _median_cpu([r.get("cpu_ms", {}) for r in rows])
            cells[f"{target} {path}"]["busy_cores"] = _median([r.get("busy_cores") for r in rows], 2)

    def ratio(a, b):
        first, second = by.get(a, {}), by.get(b, {})
        return spread([first[n]["rps"] / second[n]["rps"] for n in first
                       if n in second and second[n]["rps"] > 0])

    paths = _paths(p for _, p in by)
    ratios = {f"pyruvate/waitress {p}": ratio(("pyruvate", p), ("waitress", p)) for p in paths}
    for server in SERVERS:
        for p in paths:
            if (f"{server}-off", p) in by:
                ratios[f"{server} kit/stock {p}"] = ratio((server, p), (f"{server}-off", p))
    for p in paths:
        if ("waitress-off", p) in by:
            ratios[f"kit/hand-built {p}"] = ratio(("pyruvate", p), ("waitress-off", p))
    for name in variants.VARIANTS:
        if (variants.target(name), "blob") in by:
            label, (first, second) = variants.ratio(name)
            ratios[label] = ratio((first, "blob"), (second, "blob"))
    direct = [by.get((s, "blob"), {}) for s in SERVERS]
    for front in BEST_DIRECT_FRONTS:
        if front == "haproxy" or (front, "blob") in by:
            pool = by.get((front, "blob"), {})
            ratios[f"{front}/best direct blob"] = spread([
                pool[n]["rps"] / best for n in pool
                if (best := max((rows[n]["rps"] for rows in direct if n in rows), default=0)) > 0])
    return cells, {name: value for name, value in ratios.items() if value}


def _median(values, digits):
    """Median of the values that are not None, rounded; None when there is none."""
    values = [v for v in values if v is not None]
    return round(float(np.median(values)), digits) if values else None


def _median_cpu(per_run):
    """``{name: median CPU ms per request}`` over runs' ``cpu_ms`` dicts, names in first-seen order."""
    names = dict.fromkeys(name for cpu in per_run for name in cpu)
    return {name: _median([cpu.get(name) for cpu in per_run], 2) for name in names}


def cpu_table(cells):
    """report.md's table of CPU ms per request: one row per target and path with CPU figures,
    one column per process (first-seen order, then those of CPU_TOTALS) and the machine's busy
    cores."""
    rows = {name: cell for name, cell in cells.items() if cell.get("cpu_ms")}
    names = list(dict.fromkeys(n for cell in rows.values() for n in cell["cpu_ms"]))
    names = [n for n in names if n not in CPU_TOTALS] + [n for n in CPU_TOTALS if n in names]
    return markdown_table(["target path"] + names + ["busy cores"], [
        [name] + ["-" if cell["cpu_ms"].get(n) is None else f"{cell['cpu_ms'][n]:.2f}" for n in names]
        + [cell.get("busy_cores")] for name, cell in rows.items()])


def _columns(cells):
    """The targets measured, in table order (keys of ``cells`` are ``"<target> <path>"``)."""
    return [t for t in TARGETS + OFF + variants.targets() + CACHE_TARGETS
            if any(c.startswith(t + " ") for c in cells)]


def to_markdown(meta, cells, ratios):
    """report.md: the settings, req/s per path and target, the ratios, the latencies."""
    columns = _columns(cells)
    paths = _paths(c.split(" ", 1)[1] for c in cells)
    lines = [
        f"# Headline figures, {meta['started']}",
        "",
        f"`{meta['command']}`: {meta['rounds']} round(s) × {meta['duration_s']} s per run, wrk "
        f"{meta['connections']} connections, the order rotated per round; machine {meta['cores']} cores, "
        f"load average {meta['load_before']} before and {meta['load_after']} after; {meta['minutes']} min.",
        f"pyruvate = `{meta['clients']['pyruvate']}`, waitress = `{meta['clients']['waitress']}` directly; "
        "haproxy = the stack's pool (leastconn over both); -off = the same client with Zope's stock pipeline "
        "(no blobsendfile, no metrics filter); kit/hand-built = pyruvate against waitress-off (the backend "
        "image's waitress, 2 threads, Zope's stock pipeline)"
        + "".join(f"; {variants.legend(name)}" for name in variants.VARIANTS if variants.target(name) in columns)
        + ("; varnish = the stack's varnish directly (plain HTTP), haproxy-tls = the stack's HTTPS frontend, "
           "which sends GETs to varnish (the cache tier)" if "varnish" in columns else "")
        + "."
        + (" MiB sent through kernel pipes (splice) during the runs: "
           + ", ".join(f"{name} {mib:,.1f}" for name, mib in meta["spliced_mib"].items()) + "."
           if meta.get("spliced_mib") else ""),
        "",
        "Requests/s, median over the rounds (min–max):",
        "",
        markdown_table(["path"] + columns, [[path] + [format_spread(cells.get(f"{t} {path}", {}).get("rps"))
                                                          for t in columns] for path in paths]),
        "",
        "Ratios of req/s in the same round, median (min–max); above 1: the first is faster:",
        "",
        markdown_table(["ratio", "median (min–max)"],
                       [[name, format_spread(value, 2)] for name, value in ratios.items()]),
        "",
        "p50 / p99 latency in ms (medians over the rounds); errors summed over the rounds:",
        "",
        markdown_table(["path"] + columns, [[path] + [
            "-" if f"{t} {path}" not in cells else
            f"{cells[f'{t} {path}']['p50_ms']} / {cells[f'{t} {path}']['p99_ms']}"
            + (f", {cells[f'{t} {path}']['errors']} errors" if cells[f"{t} {path}"]["errors"] else "")
            for t in columns] for path in paths]),
        "",
        "![req/s per path and target](headline.png)",
        "",
    ]
    if any(cell.get("cpu_ms") for cell in cells.values()):
        lines[-2:-2] = [
            "CPU milliseconds per request (user + system over the counted run, median over the rounds) of "
            "each HAProxy, ZEO client (pool clients by part name) and the ZEO server, wrk, `kernel` (the "
            "kernel's threads: ksoftirqd's network work among them), `others` (every other process that ran "
            "throughout: other users, the stack's other parts, this tool), `rest` (busy time none of these "
            "account for: processes that began or ended within the run) and `machine` (all busy time); "
            f"busy cores: the machine's, of {meta['cores']}:",
            "", cpu_table(cells), ""]
    if LOGGED_IN in paths:
        lines[4:4] = [f"{LOGGED_IN}: Locust's logged-in shape ({meta['connections']} editors: front page as a Member, "
                      "folder contents, edit form, save; every body checked), not wrk; its req/s counts those "
                      "four requests together.", ""]
    return "\n".join(lines)


def plot(cells, path):
    """Grouped bars of req/s (log scale) per path, one bar per target, min-max whiskers."""
    columns = _columns(cells)
    paths = _paths(c.split(" ", 1)[1] for c in cells)
    fig, ax = new_figure(figsize=(9, 4.5))
    spread_bars(ax, paths, [(t, {p: cells.get(f"{t} {p}", {}).get("rps") for p in paths}) for t in columns])
    ax.set_yscale("log")
    ax.set_ylabel("requests/s (median, min-max; log scale)")
    ax.set_title("Headline: each server directly and through HAProxy")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    save_figure(fig, path)


@exits_2_when_not_ready("headline")
def main(argv=None):
    args = parse_args(argv)
    require_wrk()
    config = load_stack(args.stack_config)
    check_servers_up(config)
    try:
        urls, clients = targets(config)
    except LookupError as exc:
        print(f"headline: {exc}", file=sys.stderr)
        return 2
    if args.cache:
        if not config.get("cache") or not config.get("tls_url"):
            print("headline: --cache: the stack has no cache tier (no varnish or no HTTPS frontend in stack.json)",
                  file=sys.stderr)
            return 2
        urls.update({"varnish": config["cache"]["url"].rstrip("/"), "haproxy-tls": config["tls_url"].rstrip("/")})
    if args.logged_in and (refused := editors_refused(urls["haproxy"])):
        print(f"headline: --logged-in: {refused}", file=sys.stderr)
        return 2
    from plonedeploy.stack.errors import StackError

    started, clock = datetime.now(timezone.utc), time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    off_config, off_processes = None, {}
    balancers = {}  # {target: TemporaryBalancer} of the variants started, each stopped at the end
    spliced = {}
    runs, problems = [], []
    try:
        if not args.no_off:
            off_config, off_processes = start_off_clients(config, clients, urls, args.buildout_config,
                                                          not args.no_restart)
        # All variants run from here to the end; between their runs they only health-check the
        # clients (every 2 s), as the stack's HAProxy does.
        for name in args.variants:
            balancers[variants.target(name)] = variants.start(name, config, WORK_DIR)
        urls.update({target: balancer.frontend_url for target, balancer in balancers.items()})
        metrics = {"haproxy": config["haproxy_metrics_url"],
                   **{target: balancer.metrics_url for target, balancer in balancers.items()}}
        spliced_before = {name: spliced_bytes(url) for name, url in metrics.items()}
        # After the restart of the stack's clients (new PIDs) and the variants' starts.
        processes = measured_processes(config, off_processes, balancers)
        todo = plan(args.rounds, not args.no_off, args.variants, paths=args.paths, with_cache=args.cache)
        for target, label in sorted({(t, p) for _, t, p in todo}):  # warm-up, not counted
            if label == LOGGED_IN:
                # Its own 3 s warm-up holds only the logins: a client's first edit forms and
                # folder contents (templates, catalog) came 1.3-3x slower (28 Nov 2026, -off clients).
                run_locust_shape(urls[target], f"{LOGGED_IN}=1", 2, 4)
            else:
                run_wrk(urls[target] + PATHS[label][0], 2, 2, accept=PATHS[label][1])
        # A Locust run adds its 3 s warm-up and its start to the run time.
        seconds = sum(args.duration + (6 if label == LOGGED_IN else 1) for _, _, label in todo)
        print(f"{len(todo)} runs of {args.duration} s at {args.connections} connections "
              f"(about {seconds / 60:.0f} min)", flush=True)
        for done, (number, target, label) in enumerate(todo, 1):
            used = cpu_during(processes, lambda: measure(urls[target], label, args.connections, args.duration))
            wrk_cpu = used.result.pop("wrk_cpu_s", None)
            row = {"round": number, "target": target, "path": label, **used.result,
                   **cpu_figures(used.result["requests"], used, wrk_cpu)}
            runs.append(row)
            print(f"[{done}/{len(todo)}] round {number} {target:22} {label:7} {row['rps']:8.1f} req/s "
                  f"p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms errors {row['errors']}; CPU ms/req "
                  + " ".join(f"{n} {v}" for n, v in row["cpu_ms"].items() if v), flush=True)
            if row["errors"] or row.get("short_bytes"):
                problems.append(f"round {number} {target} {label}: {row['errors']} errors"
                                + (", short blob bodies" if row.get("short_bytes") else ""))
        spliced = {name: round((spliced_bytes(url) - spliced_before[name]) / 2**20, 1)
                   for name, url in metrics.items()}
        print(f"MiB spliced by the kernel during the runs: {spliced}", flush=True)
    except (RuntimeError, OSError, StackError, BalancerError, LookupError, requests.RequestException) as exc:
        problems.append(f"stopped: {exc}")
        print(f"headline: {exc}", file=sys.stderr, flush=True)
    finally:
        for balancer in balancers.values():
            balancer.stop()
        if off_config:
            extrabuild.stop(off_config)
    cells, ratios = summarize(runs)
    meta = {"started": started.strftime("%Y-%m-%d %H:%M UTC"), "command": " ".join(
                ["python -m loadtests headline", *(argv if argv is not None else sys.argv[1:])]),
            "connections": args.connections, "logged_in": args.logged_in, "paths": args.paths,
            "restarted_clients": [] if args.no_off or args.no_restart else [clients[s] for s in SERVERS],
            "duration_s": args.duration, "rounds": args.rounds, "cores": psutil.cpu_count(), "cache": args.cache,
            "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
            "minutes": round((time.monotonic() - clock) / 60, 1), "clients": clients, "urls": urls,
            "variants": {variants.target(name): variants.describe(name) for name in args.variants},
            "spliced_mib": spliced,
            "problems": problems}
    folder = report_folder(args.out, "headline")
    text = to_markdown(meta, cells, ratios)
    return finish_report(folder, {"meta": meta, "cells": cells, "ratios": ratios, "runs": runs}, text,
                         [("headline.png", lambda path: plot(cells, path))] if cells else [], problems)


if __name__ == "__main__":
    sys.exit(main())
