"""Soak: ZEO clients' RSS over a long run of mixed traffic at a fixed request rate.

Usage (stack running, site created: ``make start``)::

    .venv/bin/python -m loadtests soak [--duration 3600] [--rate 5] [--interval 10]
        [--clients instance,client2] [--paths /,/Plone,@json,blob] [--after-requests 1000]

Sends each client the same requests at the same times, straight to the client (no HAProxy):
``--rate`` requests per second per client for ``--duration`` seconds, the paths of
``--paths`` in turn (the load tests' four by default: ``/``, ``/Plone``, ``@json``, the 5 MiB
blob), at most ``--workers`` at once per client (loadtests.soak.traffic). Every ``--interval``
seconds it samples, per client, the requests served so far and the RSS of the client's process
tree (psutil; a server with worker processes counts them all). The clients: part names of
stack.json's ``clients`` (default: the stack's pool, ``servers``), or ``name=http://host:port``
for a client started otherwise (its process: the one listening on that port). Before the
first sample each client must answer ``/Plone`` with 200 (that request is not counted).

Each client's allocator is read from its running process: ``jemalloc`` when its memory maps
hold libjemalloc (the recipe's ``malloc = jemalloc``), else ``system``, with
``MALLOC_ARENA_MAX`` when its environment sets it (``unknown``: not readable, run as root).
To compare allocators, give two clients of the same server one allocator each and the memory
watchdog off (``memory-limit = off``): docs/how-to/benchmarks.md, "Memory soak".

Output: ``<out>/soak-<YYYYmmdd-HHMMSS>/`` with ``report.json`` (``meta``, ``samples``,
``summary``; loadtests.soak.summary), ``report.md`` (per client: RSS at the start, after
``--after-requests`` requests and at the end, the peak, growth per 1,000 requests, req/s,
errors, late requests) and ``soak.png`` (RSS in MiB against requests served, one line per
client). Exit status 0; 1 when a request failed or a client's process ended during the run
(recycled or restarted: its RSS is no longer the same process's); 2 when the stack or a
client is not ready or an option is invalid. Units: seconds, bytes (MiB and KiB in the
report). Traffic goes only to the clients named, on this machine or the addresses given.
"""
import os
import sys
import time
from datetime import datetime, timezone
from urllib.parse import urlsplit

import psutil

from loadtests.core.cli import add_run_arguments, add_stack_arguments, exits_2_when_not_ready, new_parser
from loadtests.core.procs import tree_rss
from loadtests.core.reports import finish_report, report_folder
from loadtests.core.stack import PATHS, NotReady, client_facts, load_stack, stack_pids
from loadtests.soak import summary as soak_summary
from loadtests.soak.traffic import ClientLoad, fetch, planned


def parse_clients(parser, text):
    """``"instance,client2,je=http://127.0.0.1:8085"`` -> ``[(name, url or None)]``: part
    names of stack.json (URL None: read from it) or ``name=http://host:port``. A bad item or a
    name given twice ends in ``parser.error`` naming ``--clients`` (exit status 2)."""
    clients = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, url = item.partition("=")
        if not name or (sep and not _is_base_url(url)):
            parser.error(f"--clients: {item!r} is not a part name of stack.json or name=http://host:port")
        clients.append((name, url.rstrip("/") if sep else None))
    names = [name for name, _ in clients]
    if not clients or len(set(names)) != len(names):
        parser.error(f"--clients: expected distinct names, got {text!r}")
    return clients


def _is_base_url(url):
    try:
        parts = urlsplit(url)
        return parts.scheme == "http" and bool(parts.hostname) and bool(parts.port) and parts.path in ("", "/")
    except ValueError:
        return False


def parse_args(argv):
    parser = new_parser(
        "soak", "RSS of ZEO clients over a long run of mixed traffic at a fixed request rate, sent "
        "straight to each client, sampled against requests served.")
    add_run_arguments(parser, duration=3600, duration_help="seconds of traffic")
    parser.add_argument("--rate", type=float, default=5.0,
                        help="requests per second to each client (default 5)")
    parser.add_argument("--interval", type=float, default=10.0,
                        help="seconds between samples of RSS and requests served (default 10)")
    parser.add_argument("--clients", type=lambda text: parse_clients(parser, text), default=None,
                        help="comma-separated part names of stack.json's clients, or name=http://host:port "
                        "(default: the stack's pool, stack.json's servers)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"comma-separated path labels, sent in turn (default {','.join(PATHS)})")
    parser.add_argument("--workers", type=int, default=2,
                        help="requests at once per client at most, each on a connection of its own (default 2)")
    parser.add_argument("--after-requests", type=int, default=1000,
                        help="the report's RSS after this many requests served, and the growth from there "
                        "(default 1000)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default 60)")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    args.paths = [label.strip() for label in args.paths.split(",") if label.strip()]
    unknown = [label for label in args.paths if label not in PATHS]
    if unknown or not args.paths:
        parser.error(f"--paths: {','.join(unknown) or 'none'} not allowed; choose from {','.join(PATHS)}")
    if args.duration < 1:
        parser.error(f"--duration must be >= 1 second, got {args.duration}")
    for name in ("rate", "interval", "timeout"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    for name in ("workers", "after_requests"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


# ----------------------------------------------------------------------------- the clients' processes

def allocator_of(maps, environ):
    """The allocator a process runs on, from the text of its ``/proc/<pid>/maps`` and its
    environment (a dict): ``"jemalloc"`` when libjemalloc is mapped, else ``"system"``; with
    ``", MALLOC_ARENA_MAX=<n>"`` when the environment sets it. ``"unknown"`` when ``maps`` is None
    (not readable)."""
    if maps is None:
        return "unknown"
    kind = "jemalloc" if "libjemalloc" in maps else "system"
    arenas = (environ or {}).get("MALLOC_ARENA_MAX")
    return f"{kind}, MALLOC_ARENA_MAX={arenas}" if arenas else kind


def process_allocator(pid):
    """:func:`allocator_of` the running process ``pid`` (reading another user's needs root)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fp:
            maps = fp.read()
        environ = psutil.Process(pid).environ()
    except (OSError, psutil.Error):
        return allocator_of(None, None)
    return allocator_of(maps, environ)


def listening_roots(port):
    """PIDs of the processes listening on TCP ``port`` whose parent does not listen there too
    (a pre-forking server's master, not its workers); [] when none is found (or the caller may
    not see it: another user's process, not root)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return []
    pids = {c.pid for c in connections if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
            and c.pid}
    roots = []
    for pid in sorted(pids):
        try:
            if psutil.Process(pid).ppid() not in pids:
                roots.append(pid)
        except psutil.Error:
            pass
    return roots


def resolve_clients(args):
    """``{name: {"url", "server", "pid"}}`` of the clients to soak (``args.clients``, default the
    stack's pool), each with the PID of its process (the stack's supervisord's for a part, the
    listener for a URL). Raises NotReady for a client not in stack.json, not running or with
    no process found."""
    given = args.clients
    config = None
    if given is None or any(url is None for _, url in given):
        config = load_stack(args.stack_config)
        if given is None:
            given = [(name, None) for name in config["servers"]]
    running = stack_pids(config) if config is not None else {}
    clients = {}
    for name, url in given:
        server = None
        if url is None:
            facts = client_facts(config, name)
            url, server = facts["url"], facts.get("server")
            if name not in running:
                raise NotReady(f"the stack's {name} is not running: make start")
            pid = running[name].pid
        else:
            roots = listening_roots(urlsplit(url).port)
            if len(roots) != 1:
                raise NotReady(f"{name}: {'no process' if not roots else f'{len(roots)} processes'} found listening "
                               f"on {url} (start the client; as another user's process it needs root to be seen)")
            pid = roots[0]
        clients[name] = {"url": url, "server": server, "pid": pid}
    return clients


def check_ready(clients, timeout):
    """GET ``/Plone`` of each client once; raises NotReady naming the first that does not
    answer 200 (not started, or no site: make start)."""
    for name, client in clients.items():
        try:
            status, _, _ = fetch(client["url"], "/Plone", timeout)
        except OSError as exc:
            raise NotReady(f"{name} at {client['url']} does not answer ({exc}): make start") from None
        if status != 200:
            raise NotReady(f"{name} at {client['url']} answers /Plone with {status}, not 200: is the site created "
                           "(make start)?")


def take_sample(clients, loads, start):
    """One sample (loadtests.soak.summary's form) at ``time.monotonic() - start`` seconds."""
    counts = {name: load.counts() for name, load in loads.items()}
    return {"t_s": round(max(time.monotonic() - start, 0.0), 3),
            "requests": {name: counts[name]["requests"] for name in clients},
            "errors": {name: counts[name]["errors"] for name in clients},
            "rss_bytes": {name: tree_rss(client["pid"]) for name, client in clients.items()}}


def soak(clients, args, progress=print):
    """Run the traffic and sample until every request is answered; returns ``(samples,
    loads)`` (``{name: ClientLoad}``). ``progress`` gets a line at every tenth of the run."""
    total = planned(args.duration, args.rate)
    loads = {name: ClientLoad(name, client["url"], args.paths, args.rate, total, args.workers, args.timeout)
             for name, client in clients.items()}
    start = time.monotonic() + 0.2
    samples = [take_sample(clients, loads, start)]
    samples[0]["t_s"] = 0.0
    for load in loads.values():
        load.start(start)
    every, told, k = max(args.duration / 10, args.interval), 0.0, 1
    while any(load.running() for load in loads.values()):
        next_at = start + k * args.interval
        while time.monotonic() < next_at and any(load.running() for load in loads.values()):
            time.sleep(min(0.2, max(next_at - time.monotonic(), 0.0)))
        if time.monotonic() >= next_at:
            samples.append(take_sample(clients, loads, start))
            # the next interval's boundary still ahead (a slow sample skips one rather than bunching up)
            k = int((time.monotonic() - start) // args.interval) + 1
            if samples[-1]["t_s"] - told >= every:
                told = samples[-1]["t_s"]
                progress(f"[{told:.0f}/{args.duration} s] " + ", ".join(
                    f"{name}: {samples[-1]['requests'][name]} requests, "
                    f"{(samples[-1]['rss_bytes'][name] or 0) / soak_summary.MiB:.1f} MiB" for name in clients))
    for load in loads.values():
        load.join()
    samples.append(take_sample(clients, loads, start))
    return samples, loads


def problems_of(clients, loads, samples):
    """One line per failed request kind and per client whose process ended during the run."""
    problems = []
    for name, load in loads.items():
        for message, count in load.messages.most_common():
            problems.append(f"{name}: {count} failed: {message}")
        if load.errors > sum(load.messages.values()):
            problems.append(f"{name}: {load.errors - sum(load.messages.values())} more failed requests")
    for name, client in clients.items():
        gone = next((s["t_s"] for s in samples if s["rss_bytes"][name] is None), None)
        if gone is not None:
            problems.append(f"{name}: its process {client['pid']} ended by {gone:.0f} s (recycled by the memory "
                            "watchdog, or restarted?): its RSS is not sampled after that")
    return problems


@exits_2_when_not_ready("soak")
def main(argv=None):
    args = parse_args(argv)
    clients = resolve_clients(args)
    check_ready(clients, args.timeout)
    for client in clients.values():
        client["allocator"] = process_allocator(client["pid"])
    meta = {
        "command": "python -m loadtests soak " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rate": args.rate, "duration_s": args.duration, "interval_s": args.interval, "paths": args.paths,
        "workers": args.workers, "after_requests": args.after_requests, "planned_requests": planned(
            args.duration, args.rate),
        "cores": psutil.cpu_count(), "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    print(f"soak: {meta['planned_requests']} requests to each of {', '.join(clients)} at {args.rate:g}/s "
          f"({args.duration} s)", flush=True)
    samples, loads = soak(clients, args, progress=lambda line: print(line, flush=True))
    meta["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    for name, load in loads.items():
        clients[name].update(late=load.late, max_lag_s=round(load.max_lag_s, 3), body_bytes=load.bytes,
                             error_messages=dict(load.messages))
    meta["clients"] = clients
    figures = soak_summary.summarize(samples, list(clients), args.after_requests)
    labels = {name: f"{name} ({client['server'] or 'client'}, {client['allocator']})"
              for name, client in clients.items()}
    return finish_report(report_folder(args.out, "soak"), {"meta": meta, "summary": figures, "samples": samples},
                         soak_summary.to_markdown(meta, figures),
                         [("soak.png", lambda path: soak_summary.plot(samples, labels, args.after_requests, path))],
                         problems_of(clients, loads, samples))


if __name__ == "__main__":
    sys.exit(main())
