"""Is every connection served under overload? Count completions per connection.

Usage (stack running, site created; see ``make start``)::

    .venv/bin/python -m loadtests.fairness [--connections 1000,10000] [--duration 60]
        [--timeout 45] [--paths /] [--baseline 10] [--baseline-duration 15]
        [--connect-rate 2000] [--out var/reports]

For each path, first ``--baseline`` connections (default 10) run for
``--baseline-duration`` seconds: the reference throughput (requests/s). Then, for each
number in ``--connections``, that many keep-alive connections to the HAProxy frontend of
``parts/stack/stack.json`` send GET requests in a closed loop (next request as soon as
the answer is in) for ``--duration`` seconds. Connections are opened at
``--connect-rate`` per second (a burst of 10,000 SYNs overflows the kernel's accept
queue and delays some connections by SYN retransmits of 1, 3, 7 ... s, which is the load
generator's unfairness, not the server's). Every request has a client timeout
(``--timeout`` seconds, shorter than the run); a request still open when the run ends
is counted as ``unfinished``, not as an error.

Recorded per connection: completions (2xx/3xx answers), errors by kind (``timeout``,
``connect``, ``reset``, ``closed`` (no answer before EOF), ``malformed``, ``non_2xx``) and latencies
(seconds from sending the request to the last body byte). Reported per run:
connections served (at least one completion) / total, min / median / max completions
per connection, errors by kind, requests/s over the run (completions / run seconds), latency
mean / p50 / p99 / max, the Little's-law mean (connections / requests/s: the mean a closed
loop must show if every connection is served in turn) and p99 / Little's mean, the ratio
of requests/s to the baseline, HAProxy's 5xx answers and longest backend queue
(``/stats;csv``, ``qmax`` is since HAProxy started), the kernel's accept-queue
overflows (``ListenOverflows`` of /proc/net/netstat, whole machine), and the CPU seconds of the stack,
of this client and of foreign processes (the machine is shared).

Output: a table on stdout and ``<out>/fairness-<YYYYmmdd-HHMMSS>/report.json`` and
``report.md``. Exit status 0 when every connection was served with 0 errors and 0
non-2xx answers, 1 otherwise, 2 when the stack is not ready or an option is invalid.
Traffic goes only to 127.0.0.1.
"""
import argparse
import asyncio
import statistics
import sys
from collections import Counter
from datetime import datetime, timezone
from urllib.parse import urlsplit

import psutil

from loadtests import haproxy_stats
from loadtests.core import (add_run_arguments, add_stack_arguments, cpu_seconds, exits_2_when_not_ready,
                            fetch_stats, frontend_maxconn, load_stack, machine_busy_seconds, markdown_table,
                            parse_counts, percentile, raise_fd_limit, report_folder, stack_pids,
                            wait_backend_idle, write_report)

#: Largest response head accepted (bytes); Plone's headers are a few kB.
HEAD_LIMIT = 2**20


class ConnectionStats:
    """What one connection got: ``completions`` (int), ``errors`` (Counter kind -> count),
    ``latencies`` (list of seconds, one per completion), ``connects`` (TCP connections
    opened, 1 + reconnects after the server closed or an error) and ``unfinished`` (1 if a
    request was still open at the end of the run)."""

    __slots__ = ("completions", "errors", "latencies", "connects", "unfinished")

    def __init__(self):
        self.completions = 0
        self.errors = Counter()
        self.latencies = []
        self.connects = 0
        self.unfinished = 0


def summarize(stats, seconds):
    """Aggregate a list of ConnectionStats over a run of ``seconds``.

    Returns a dict: connections, served (connections with >= 1 completion), completions
    min/median/max per connection, requests, rps (requests/s), errors {kind: count},
    unfinished, latency_s {mean, p50, p99, max} (None without completions),
    littles_law_mean_s (connections / rps, None when rps is 0) and p99_over_littles_mean.
    """
    per_conn = sorted(s.completions for s in stats)
    latencies = sorted(x for s in stats for x in s.latencies)
    errors = Counter()
    for s in stats:
        errors.update(s.errors)
    requests = sum(per_conn)
    rps = requests / seconds if seconds > 0 else 0.0
    little = len(stats) / rps if rps else None
    p99 = percentile(latencies, 0.99)
    return {
        "connections": len(stats),
        "served": sum(1 for n in per_conn if n > 0),
        "completions_min": per_conn[0] if per_conn else 0,
        "completions_median": statistics.median(per_conn) if per_conn else 0,
        "completions_max": per_conn[-1] if per_conn else 0,
        "requests": requests,
        "rps": round(rps, 1),
        "errors": dict(sorted(errors.items())),
        "unfinished": sum(s.unfinished for s in stats),
        "latency_s": {
            "mean": round(statistics.fmean(latencies), 3) if latencies else None,
            "p50": round(percentile(latencies, 0.50), 3) if latencies else None,
            "p99": round(p99, 3) if latencies else None,
            "max": round(latencies[-1], 3) if latencies else None,
        },
        "littles_law_mean_s": round(little, 3) if little else None,
        "p99_over_littles_mean": round(p99 / little, 2) if little and latencies else None,
    }


async def read_response(reader):
    """Read one HTTP/1.1 response; return ``(status, keep_alive)``.

    Handles Content-Length, chunked and close-delimited bodies (the body is discarded).
    Raises asyncio.IncompleteReadError when the peer closes before the response is
    complete, ValueError on a malformed status line.
    """
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    keep_alive = "close" not in headers.get("connection", "")
    if "chunked" in headers.get("transfer-encoding", ""):
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)  # data + CRLF
            if size == 0:  # no trailers expected from HAProxy/Zope
                break
    elif "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif status not in (204, 304):
        await reader.read()  # close-delimited body
        keep_alive = False
    return status, keep_alive


async def one_connection(stats, host, port, request, start_at, deadline, timeout):
    """Closed loop on one connection until ``deadline`` (loop time, seconds): connect at
    ``start_at``, send ``request`` (bytes), read the answer, repeat; reconnect when the
    server closes or after an error. Updates ``stats`` (ConnectionStats) in place."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - loop.time()))
    reader = writer = None
    try:
        while loop.time() < deadline:
            remaining = deadline - loop.time()
            try:
                if writer is None:
                    stats.connects += 1
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(host, port, limit=HEAD_LIMIT), min(timeout, remaining))
                sent = loop.time()
                writer.write(request)
                status, keep_alive = await asyncio.wait_for(read_response(reader),
                                                            min(timeout, deadline - sent))
            except asyncio.TimeoutError:
                if loop.time() >= deadline - 0.001:
                    stats.unfinished += 1  # the run ended first: not the server's fault
                    break
                stats.errors["connect" if reader is None else "timeout"] += 1
                keep_alive = False
            except asyncio.IncompleteReadError:
                stats.errors["closed"] += 1
                keep_alive = False
            except (ValueError, IndexError, asyncio.LimitOverrunError):
                stats.errors["malformed"] += 1  # not HTTP/1.1, or a head over HEAD_LIMIT
                keep_alive = False
            except OSError:  # ConnectionRefusedError, ConnectionResetError, ...
                stats.errors["connect" if reader is None else "reset"] += 1
                keep_alive = False
                if reader is None and loop.time() < deadline:
                    await asyncio.sleep(min(1.0, deadline - loop.time()))  # no busy loop on refusals
            else:
                if 200 <= status < 400:
                    stats.completions += 1
                    stats.latencies.append(loop.time() - sent)
                else:
                    stats.errors["non_2xx"] += 1
            if not keep_alive and writer is not None:
                writer.close()
                reader = writer = None
    finally:
        if writer is not None:
            writer.close()


async def run_load(url, accept, connections, duration, timeout, connect_rate):
    """Hold ``connections`` closed-loop connections to ``url`` for ``duration`` seconds.

    Connects are spread at ``connect_rate`` per second from the start; the run (and the
    requests/s denominator) is ``duration`` seconds from the start. Returns
    ``(list of ConnectionStats, run seconds)``.
    """
    parts = urlsplit(url)
    path = parts.path or "/"
    request = (f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUser-Agent: plonedeploy-fairness\r\n"
               + (f"Accept: {accept}\r\n" if accept else "") + "\r\n").encode("ascii")
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + duration
    stats = [ConnectionStats() for _ in range(connections)]
    await asyncio.gather(*(
        one_connection(s, parts.hostname, parts.port or 80, request, start + i / connect_rate,
                       deadline, timeout)
        for i, s in enumerate(stats)))
    return stats, duration


def frontend_5xx(rows):
    """Sum of ``hrsp_5xx`` over the FRONTEND rows of a stats fetch, the stats listener excluded."""
    return sum(int(r["hrsp_5xx"] or 0) for r in rows
               if r["svname"] == "FRONTEND" and r["pxname"] != "stats")


def listen_overflows():
    """``TcpExt: ListenOverflows`` of /proc/net/netstat: connections the kernel dropped
    because a listening socket's accept queue (its backlog, at most net.core.somaxconn)
    was full. Counts for the whole network namespace; 0 where the file is missing."""
    try:
        lines = open("/proc/net/netstat", encoding="ascii").read().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split()[1:], values.split()[1:])).get("ListenOverflows", 0))
    return 0


def measure(config, url, accept, connections, duration, timeout, connect_rate):
    """One run through the stack's HAProxy with HAProxy counters and CPU seconds; returns
    summarize()'s dict plus ``haproxy`` {hrsp_5xx, backend_qmax} and ``cpu_s``."""
    wait_backend_idle(config)
    procs = stack_pids(config)
    before = haproxy_stats.fetch(config["stats_url"])
    cpu_before, busy_before = cpu_seconds(procs), machine_busy_seconds()
    me = psutil.Process()
    own_before = sum(me.cpu_times()[:2])
    overflows_before = listen_overflows()
    stats, seconds = asyncio.run(run_load(url, accept, connections, duration, timeout, connect_rate))
    own = sum(me.cpu_times()[:2]) - own_before
    stack_cpu = sum(v - cpu_before.get(n, 0.0) for n, v in cpu_seconds(procs).items())
    busy = machine_busy_seconds() - busy_before
    after = haproxy_stats.fetch(config["stats_url"])
    servers = haproxy_stats.deltas(before, after, config["backend"])
    result = summarize(stats, seconds)
    foreign = max(busy - stack_cpu - own, 0.0)
    result.update({
        "duration_s": seconds,
        "timeout_s": timeout,
        "connect_rate_per_s": connect_rate,
        "haproxy": {
            "sessions": sum(d["stot"] for d in servers.values()),
            # The frontend's count: it includes HAProxy's own 503s (queue timeout, no server).
            "hrsp_5xx": frontend_5xx(after) - frontend_5xx(before),
            "backend_qmax": int(haproxy_stats.backend_row(after, config["backend"])["qmax"] or 0),
        },
        "listen_overflows": listen_overflows() - overflows_before,
        "cpu_s": {"stack": round(stack_cpu, 1), "client": round(own, 1),
                  "foreign": round(foreign, 1),
                  "foreign_percent": round(100 * foreign / (seconds * (psutil.cpu_count() or 1)), 1)},
    })
    return result


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests fairness",
        description="N keep-alive connections per path through HAProxy, closed loop; counts "
        "completions per connection (is every connection served?), errors, requests/s, "
        "latency percentiles and p99 / Little's-law mean.")
    parser.add_argument("--connections", default="1000",
                        help="comma-separated connection counts, one run each (default 1000)")
    add_run_arguments(parser, duration=60.0, rounds=1, rounds_help=(
        "repeat baseline + every connection count this many times, alternating, so each ratio "
        "is to a baseline measured minutes apart under the same foreign load"))
    parser.add_argument("--timeout", type=float, default=None,
                        help="client timeout per request, seconds; must be shorter than the run "
                        "(default 3/4 of --duration)")
    parser.add_argument("--paths", default="/",
                        help="comma-separated URL paths (default /); @json = /Plone as JSON")
    parser.add_argument("--baseline", type=int, default=10,
                        help="connections of the reference run per path (default 10; 0: none)")
    parser.add_argument("--baseline-duration", type=float, default=15.0,
                        help="seconds of the reference run (default 15)")
    parser.add_argument("--connect-rate", type=float, default=2000.0,
                        help="new connections per second at the start of a run (default 2000)")
    parser.add_argument("--url", default=None,
                        help="frontend base URL (default: the stack's frontend_url); must be "
                        "127.0.0.1")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    args.connections = parse_counts(parser, "--connections", args.connections)
    if args.timeout is None:
        args.timeout = args.duration * 0.75
    if not 0 < args.timeout < args.duration:
        parser.error(f"--timeout ({args.timeout} s) must be > 0 and shorter than --duration "
                     f"({args.duration} s)")
    if args.connect_rate <= 0 or args.baseline < 0 or args.baseline_duration <= 0 or args.rounds < 1:
        parser.error("--connect-rate and --baseline-duration must be > 0, --baseline >= 0, "
                     "--rounds >= 1")
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in args.paths if not (p.startswith("/") or p == "@json")]
    if bad or not args.paths:
        parser.error(f"--paths: {bad or 'empty'}: each must start with / (or be @json)")
    return args


def to_markdown(rows, meta):
    """The rows (one per path and connection count) as a Markdown table with a header."""
    lines = [
        f"# Fairness: {meta['duration_s']} s closed-loop runs through HAProxy",
        "",
        f"{meta['started']}; HAProxy frontend maxconn {meta['haproxy_maxconn']}, balance "
        f"{meta['balance']}; client timeout {meta['timeout_s']} s; connects "
        f"{meta['connect_rate_per_s']}/s; fd limit {meta['fd_limit']}; somaxconn {meta['somaxconn']}.",
        "",
        markdown_table(
            ["round", "path", "connections", "served", "completions min/median/max", "errors", "unfinished",
             "req/s", "baseline req/s", "ratio", "mean s", "p50 s", "p99 s", "max s", "Little's mean s",
             "p99 / Little", "HAProxy 5xx", "queue max", "accept-queue overflows", "foreign CPU %"],
            [[r["round"], r["path"], r["connections"], r["served"],
              f"{r['completions_min']}/{r['completions_median']}/{r['completions_max']}",
              ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0", r["unfinished"], r["rps"],
              r.get("baseline_rps"), r.get("ratio_to_baseline"),
              *(r["latency_s"][k] for k in ("mean", "p50", "p99", "max")), r["littles_law_mean_s"],
              r["p99_over_littles_mean"], r["haproxy"]["hrsp_5xx"], r["haproxy"]["backend_qmax"],
              r.get("listen_overflows"), r["cpu_s"]["foreign_percent"]] for r in rows]),
    ]
    return "\n".join(lines) + "\n"


@exits_2_when_not_ready("fairness")
def main(argv=None):
    args = parse_args(argv)
    config = load_stack(args.stack_config)
    fetch_stats(config)
    base = (args.url or config["frontend_url"]).rstrip("/")
    if urlsplit(base).hostname != "127.0.0.1":
        print(f"--url must point at 127.0.0.1, got {base}", file=sys.stderr)
        return 2
    fd_limit = raise_fd_limit(max(args.connections) + 64)
    if fd_limit[0] < max(args.connections) + 16:
        print(f"fd limit {fd_limit} too low for {max(args.connections)} connections", file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc)
    rows = []
    for label, round_ in ((p, i) for i in range(1, args.rounds + 1) for p in args.paths):
        path, accept = ("/Plone", "application/json") if label == "@json" else (label, "")
        url = base + path
        baseline = None
        if args.baseline:
            b = measure(config, url, accept, args.baseline, args.baseline_duration,
                        min(args.timeout, args.baseline_duration * 0.75), args.connect_rate)
            baseline = b["rps"]
            b.update(path=label, round=round_, baseline_rps=baseline, ratio_to_baseline=1.0)
            rows.append(b)
            print(f"{label}: baseline {args.baseline} connections: {baseline} req/s", flush=True)
        for n in args.connections:
            print(f"{label}: {n} connections for {args.duration} s ...", flush=True)
            r = measure(config, url, accept, n, args.duration, args.timeout, args.connect_rate)
            r.update(path=label, round=round_, baseline_rps=baseline,
                     ratio_to_baseline=round(r["rps"] / baseline, 2) if baseline else None)
            if r["rps"] and n / r["rps"] > args.duration:
                r["note"] = (f"connections / req/s = {n / r['rps']:.0f} s > run length: not every "
                             "connection can be served in this run")
            rows.append(r)
            print(f"  served {r['served']}/{n}, {r['rps']} req/s, errors {r['errors'] or 0}, "
                  f"p99 {r['latency_s']['p99']} s, p99/Little {r['p99_over_littles_mean']}", flush=True)
    meta = {
        "started": started.isoformat(timespec="seconds"),
        "duration_s": args.duration,
        "timeout_s": args.timeout,
        "connect_rate_per_s": args.connect_rate,
        "haproxy_maxconn": frontend_maxconn(config) if not args.url else None,
        "balance": config.get("balance"),
        "fd_limit": list(fd_limit),
        "somaxconn": int(open("/proc/sys/net/core/somaxconn").read()),
        "cores": psutil.cpu_count(),
        "url": base,
    }
    folder = report_folder(args.out, "fairness", started)
    text = to_markdown(rows, meta)
    write_report(folder, {"meta": meta, "runs": rows}, text)
    print(text)
    print(f"report: {folder}")
    clean = all(r["served"] == r["connections"] and not r["errors"] for r in rows)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
