"""Hold many concurrent connections on each path through HAProxy and report what happens.

Usage (stack running, site created; see ``make start``)::

    .venv/bin/python -m loadtests.connections [--connections 1000] [--duration 60]
        [--paths /,/Plone,@json,blob] [--timeout 90] [--out var/reports]

For each path, wrk (Debian's ``wrk``) keeps ``--connections`` keep-alive connections to
the HAProxy frontend of ``parts/stack/stack.json`` busy for ``--duration`` seconds (after a
short warm-up at 10 connections). HAProxy holds them all (its global ``maxconn``) and
passes at most ``maxconn`` = threads requests to each ZEO client; the rest wait in its
backend queue (``timeout queue``). Reported per path: requests, RPS, MiB/s, latency mean /
p50 / p90 / p99 / max (seconds), wrk's socket errors by kind (connect, read, write,
timeout), non-2xx/3xx answers (wrk "status" errors), HAProxy's 5xx and longest queue, the
Little's-law mean (connections / RPS: what the mean latency must be if every connection is
served in turn) with p99 relative to it, and the CPU seconds of the stack, of wrk and of
foreign processes (the machine is shared).

Output: a table on stdout and ``<out>/connections-<YYYYmmdd-HHMMSS>/report.json`` and
``report.md``. Exit status: 0 when every path had 0 socket errors and 0 non-2xx
answers, 1 otherwise, 2 when the stack is not ready, wrk is missing or an option is invalid.
Traffic goes only to 127.0.0.1.
"""
import argparse
import sys
from datetime import datetime, timezone

import psutil

from loadtests import haproxy_stats
from loadtests.core import (PATHS, add_run_arguments, add_stack_arguments, check_servers_up, cpu_seconds,
                            exits_2_when_not_ready, frontend_maxconn, load_stack, machine_busy_seconds,
                            markdown_table, raise_fd_limit, report_folder, require_wrk, run_wrk, stack_pids,
                            wait_backend_idle, write_report)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests connections",
        description="Hold N concurrent connections per path through HAProxy (wrk) and report "
        "errors, RPS and latency percentiles.")
    parser.add_argument("--connections", type=int, default=1000,
                        help="concurrent keep-alive connections held by wrk (default 1000)")
    add_run_arguments(parser, duration=60, warmup=3,
                      warmup_help="seconds at 10 connections before each path (0: none)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"comma-separated, from: {', '.join(PATHS)} (default: all)")
    parser.add_argument("--timeout", type=int, default=90,
                        help="seconds wrk waits for one response before counting a timeout "
                        "(default 90: longer than HAProxy's timeout queue, so a starved "
                        "request shows as HAProxy's 503, not as a wrk timeout)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in args.paths if p not in PATHS]
    if bad or not args.paths:
        parser.error(f"--paths: {', '.join(bad) or 'empty'} not allowed; allowed: {', '.join(PATHS)}")
    for name in ("connections", "duration", "timeout", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.connections < args.threads:
        parser.error("--connections must be at least --threads")
    return args


def measure_path(args, config, wrk, label):
    """Warm up, then hold ``args.connections`` on one path; return the path's result dict."""
    path, accept = PATHS[label]
    url = config["frontend_url"] + path
    wait_backend_idle(config)
    if args.warmup:
        run_wrk(url, min(10, args.connections), args.warmup, threads=args.threads, timeout=args.timeout,
                accept=accept, wrk=wrk)
    procs = stack_pids(config)
    before = haproxy_stats.fetch(config["stats_url"])
    cpu_before, busy_before = cpu_seconds(procs), machine_busy_seconds()

    def progress(elapsed):
        try:
            rows = haproxy_stats.fetch(config["stats_url"])
        except OSError as exc:
            print(f"  {label}: {elapsed:4.0f}/{args.duration} s, HAProxy stats not answering: {exc}",
                  flush=True)
            return
        done = sum(d["stot"] for d in haproxy_stats.deltas(before, rows, config["backend"]).values())
        queued = haproxy_stats.backend_row(rows, config["backend"])["qcur"]
        print(f"  {label}: {elapsed:4.0f}/{args.duration} s, {done} requests served, "
              f"{queued} queued in HAProxy", flush=True)

    summary = run_wrk(url, args.connections, args.duration, threads=args.threads, timeout=args.timeout,
                      accept=accept, wrk=wrk, progress=progress)
    after = haproxy_stats.fetch(config["stats_url"])
    stack_cpu = {n: v - cpu_before.get(n, 0.0) for n, v in cpu_seconds(procs).items()}
    wrk_cpu = summary["cpu_s"]
    busy = machine_busy_seconds() - busy_before
    drained = wait_backend_idle(config)  # requests still queued when wrk stopped: dropped (abortonclose)
    servers = haproxy_stats.deltas(before, after, config["backend"])
    seconds = summary["duration_us"] / 1e6
    rps = summary["requests"] / seconds if seconds else 0.0
    lat = {k: v / 1e6 for k, v in summary["latency_us"].items()}
    little = args.connections / rps if rps else None
    errors = summary["errors"]
    return {
        "path": label,
        "url": url,
        "connections": args.connections,
        "duration_s": round(seconds, 1),
        "requests": summary["requests"],
        "rps": round(rps, 1),
        "mib_per_s": round(summary["bytes"] / seconds / 2**20, 1) if seconds else 0.0,
        "latency_s": {k: round(v, 3) for k, v in lat.items()},
        "littles_law_mean_s": round(little, 3) if little else None,
        "p99_over_littles_mean": round(lat["p99"] / little, 2) if little else None,
        "socket_errors": {k: errors[k] for k in ("connect", "read", "write", "timeout")},
        "non_2xx_3xx": errors["status"],
        "haproxy": {
            "drain_after_run_s": round(drained, 1),
            "sessions": sum(d["stot"] for d in servers.values()),
            "hrsp_5xx": sum(d["hrsp_5xx"] for d in servers.values()),
            "backend_qmax": int(haproxy_stats.backend_row(after, config["backend"])["qmax"] or 0),
            "per_server_sessions": {n: d["stot"] for n, d in servers.items()},
        },
        "cpu_s": {
            "stack": {n: round(v, 1) for n, v in stack_cpu.items()},
            "wrk": round(wrk_cpu, 1),
            "foreign": round(max(busy - sum(stack_cpu.values()) - wrk_cpu, 0.0), 1),
            "foreign_percent": round(100 * max(busy - sum(stack_cpu.values()) - wrk_cpu, 0.0)
                                     / (seconds * (psutil.cpu_count() or 1)), 1) if seconds else 0.0,
        },
    }


def to_markdown(results, meta):
    """Return the results as a Markdown table (one row per path) with a header paragraph."""
    lines = [
        f"# {meta['connections']} connections through HAProxy, {meta['duration_s']} s per path",
        "",
        f"{meta['started']}; HAProxy maxconn {meta['haproxy_maxconn']}, balance {meta['balance']}, "
        f"servers {', '.join(f'{n} ({k})' for n, k in meta['servers'].items())}; wrk {meta['threads']} "
        f"threads, timeout {meta['timeout_s']} s; fd limit {meta['fd_limit']}.",
        "",
        markdown_table(
            ["path", "requests", "RPS", "MiB/s", "mean s", "p50 s", "p90 s", "p99 s", "max s",
             "Little's mean s", "p99 / Little", "socket errors c/r/w/t", "non-2xx", "HAProxy 5xx",
             "queue max", "foreign CPU %"],
            [[r["path"], r["requests"], r["rps"], r["mib_per_s"], *(r["latency_s"][k] for k in
              ("mean", "p50", "p90", "p99", "max")), r["littles_law_mean_s"], r["p99_over_littles_mean"],
              "/".join(str(r["socket_errors"][k]) for k in ("connect", "read", "write", "timeout")),
              r["non_2xx_3xx"], r["haproxy"]["hrsp_5xx"], r["haproxy"]["backend_qmax"],
              r["cpu_s"]["foreign_percent"]] for r in results]),
    ]
    return "\n".join(lines) + "\n"


@exits_2_when_not_ready("connections")
def main(argv=None):
    args = parse_args(argv)
    wrk = require_wrk()
    config = load_stack(args.stack_config)
    check_servers_up(config)
    maxconn = frontend_maxconn(config)
    fd_limit = raise_fd_limit(args.connections + 64)
    if fd_limit[0] < args.connections + 16:
        print(f"fd limit {fd_limit} too low for {args.connections} connections", file=sys.stderr)
        return 2
    if maxconn and args.connections > maxconn:
        print(f"note: {args.connections} connections > HAProxy maxconn {maxconn}: the rest wait in "
              "the kernel's accept backlog", flush=True)
    started = datetime.now(timezone.utc)
    total = len(args.paths) * (args.duration + args.warmup)
    print(f"{args.connections} connections, {len(args.paths)} paths x {args.duration} s "
          f"(+{args.warmup} s warm-up): about {total} s", flush=True)
    results = []
    for number, label in enumerate(args.paths, start=1):
        print(f"[{number}/{len(args.paths)}] {label}", flush=True)
        try:
            result = measure_path(args, config, wrk, label)
        except RuntimeError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        results.append(result)
        e = result["socket_errors"]
        print(f"  {label}: {result['requests']:,} requests, {result['rps']} RPS, p50 "
              f"{result['latency_s']['p50']} s, p99 {result['latency_s']['p99']} s, socket errors "
              f"{sum(e.values())}, non-2xx {result['non_2xx_3xx']}", flush=True)
    meta = {
        "started": started.isoformat(timespec="seconds"),
        "connections": args.connections,
        "duration_s": args.duration,
        "timeout_s": args.timeout,
        "threads": args.threads,
        "haproxy_maxconn": maxconn,
        "balance": config.get("balance"),
        "servers": config["server_kinds"],
        "fd_limit": list(fd_limit),
        "cores": psutil.cpu_count(),
    }
    folder = report_folder(args.out, "connections", started)
    text = to_markdown(results, meta)
    write_report(folder, {"meta": meta, "paths": results}, text)
    print(text)
    print(f"report: {folder}")
    clean = all(sum(r["socket_errors"].values()) == 0 and r["non_2xx_3xx"] == 0 for r in results)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
