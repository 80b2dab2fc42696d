"""Cache on vs off: anonymous pages through the full edge (TLS, HAProxy, varnish, the pool).

Usage (stack running with its cache tier, site created; ``make start``)::

    .venv/bin/python -m loadtests cache [--connections 10,100] [--duration 20]
        [--rounds 2] [--path /Plone] [--out var/reports]

Both variants go through the same HTTPS listener of the same HAProxy (``tls_url`` of
``parts/stack/stack.json``), side by side in one run: **on** is the stack as built
(GET and HEAD go to varnish); for **off** the varnish server of HAProxy's ``cache``
backend is put in maintenance through the runtime API, so the same requests go straight
to the pool (the path HAProxy takes when varnish is down). Each round measures, for each
connection count, both variants, in alternating order (on first in odd rounds), after a
``--warmup`` of a few seconds at the same connection count that is not counted.

wrk (Debian's; HTTP/1.1 over TLS with keep-alive) drives the load. Reported per variant,
connection count and round: requests/s, p50 and p99 latency (milliseconds), varnish's hit
ratio (``MAIN.cache_hit`` / (hits + ``MAIN.cache_miss`` + ``MAIN.cache_hitpass`` + passes)
from varnishstat), and the CPU milliseconds per request of each process of the stack
(psutil, whole process trees: varnishd's worker is a child of its manager), of wrk and of
the rest of the machine. The summary gives per connection count the ratio on/off of the
requests/s: the median over the rounds and its range (min–max). Machines here are shared
(±25 % run to run): only the ratio within one run is meaningful.

Output: a table on stdout, ``<out>/cachebench-<YYYYmmdd-HHMMSS>/{report.md,report.json,
cachebench.png}``. Exit status 0; 1 when a run had socket errors or non-2xx answers; 2 when
the stack has no cache tier, is not running, or an option is invalid. The varnish server is
always put back in service, also on errors. Traffic goes only to the stack on 127.0.0.1.
"""
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

import psutil

from loadtests.core.cli import (add_counts_argument, add_run_arguments, add_stack_arguments, exits_2_when_not_ready,
                                new_parser)
from loadtests.core.procs import cpu_ms_per_request, machine_busy_seconds, tree_cpu_seconds
from loadtests.core.reports import markdown_table, new_figure, report_folder, save_figure, write_report
from loadtests.core.stack import NotReady, load_stack, stack_pids
from loadtests.core.wrk import require_wrk, run_wrk
from plonedeploy.stack.rolling import RollingError, drain, enable

# HAProxy backend and server of the cache tier (haproxy.cfg.j2).
CACHE_BACKEND, CACHE_SERVER = "cache", "varnish"
COUNTERS = ("MAIN.cache_hit", "MAIN.cache_miss", "MAIN.cache_hitpass", "MAIN.s_pass")


def parse_args(argv):
    parser = new_parser(
        "cache", "Requests/s, p50/p99, hit ratio and CPU per request of anonymous pages "
        "through the HTTPS edge with the cache tier on and off, side by side.")
    add_counts_argument(parser, "--connections", "10,100", "comma-separated connection counts held by wrk")
    add_run_arguments(parser, duration=20, warmup=3, rounds=2,
                      rounds_help="rounds of on/off pairs, alternating which goes first")
    parser.add_argument("--path", default="/Plone", help="URL path (default /Plone)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.connections) < args.threads:
        parser.error(f"--connections: each count must be at least --threads ({args.threads})")
    for name in ("duration", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.warmup < 0 or not args.path.startswith("/"):
        parser.error("--warmup must be >= 0 and --path must start with /")
    return args


def varnish_counters(workdir):
    """``{counter: int}`` of :data:`COUNTERS` from ``varnishstat -n workdir -1 -j``."""
    out = subprocess.run(["varnishstat", "-n", workdir, "-1", "-j"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    data = json.loads(out)
    data = data.get("counters", data)  # varnish 7 nests them under "counters"
    return {name: int(data[name]["value"]) for name in COUNTERS}


def set_cache(config, on):
    """Put varnish in service (``on``: state ready, until HAProxy has it UP) or in
    maintenance (drained, then MAINT) in HAProxy's ``cache`` backend, at most 10 s each:
    the runtime API steps of a rolling restart (plonedeploy.stack.rolling). Raises
    RollingError."""
    (enable if on else drain)(config["haproxy_socket"], CACHE_BACKEND, CACHE_SERVER, timeout=10)


def measure(args, config, wrk, on, connections):
    """One measured run; returns a result dict (see the module docstring for the fields)."""
    set_cache(config, on)
    url = config["tls_url"] + args.path
    if args.warmup:
        run_wrk(url, connections, args.warmup, threads=args.threads, timeout=60, wrk=wrk)
    procs = stack_pids(config)
    cpu0 = {name: tree_cpu_seconds(p.pid) for name, p in procs.items()}
    counters0 = varnish_counters(config["cache"]["workdir"])
    busy0 = machine_busy_seconds()
    summary = run_wrk(url, connections, args.duration, threads=args.threads, timeout=60, wrk=wrk)
    busy = machine_busy_seconds() - busy0
    # Varnish's worker threads add their counts to the shared counters in batches.
    time.sleep(1.0)
    counters = {k: v - counters0[k] for k, v in varnish_counters(config["cache"]["workdir"]).items()}
    cpu = {name: tree_cpu_seconds(p.pid) - cpu0[name] for name, p in procs.items()}
    requests = summary["requests"]
    seconds = summary["duration_us"] / 1e6
    looked_up = sum(counters.values())
    errors = sum(summary["errors"].values())
    stack_cpu = sum(cpu.values())
    return {
        "cache": "on" if on else "off",
        "connections": connections,
        "requests": requests,
        "rps": round(requests / seconds, 1),
        "p50_ms": round(summary["latency_us"]["p50"] / 1000, 1),
        "p99_ms": round(summary["latency_us"]["p99"] / 1000, 1),
        "errors": errors,
        "hit_ratio": round(counters["MAIN.cache_hit"] / looked_up, 4) if looked_up else None,
        "varnish_counters": counters,
        "cpu_ms_per_request": cpu_ms_per_request(cpu, requests),
        # wrk and everything else on the machine: what the stack did not use of the busy time.
        "other_cpu_ms_per_request": round(1000 * max(busy - stack_cpu, 0) / max(requests, 1), 3),
    }


def summarize(runs, counts):
    """``{connections: {rps_on, rps_off, ratio_median, ratio_min, ratio_max}}`` (medians over
    rounds; the ratio is on/off of each round's pair)."""
    out = {}
    for n in counts:
        rounds = sorted({r["round"] for r in runs if r["connections"] == n})
        ratios = []
        for k in rounds:
            pair = {r["cache"]: r for r in runs if r["connections"] == n and r["round"] == k}
            if pair["off"]["rps"]:
                ratios.append(pair["on"]["rps"] / pair["off"]["rps"])
        on = [r["rps"] for r in runs if r["connections"] == n and r["cache"] == "on"]
        off = [r["rps"] for r in runs if r["connections"] == n and r["cache"] == "off"]
        out[n] = {
            "rps_on": round(statistics.median(on), 1),
            "rps_off": round(statistics.median(off), 1),
            "ratio_median": round(statistics.median(ratios), 1) if ratios else None,
            "ratio_min": round(min(ratios), 1) if ratios else None,
            "ratio_max": round(max(ratios), 1) if ratios else None,
        }
    return out


def markdown(meta, runs, summary):
    """The report as Markdown text."""
    names = sorted({name for r in runs for name in r["cpu_ms_per_request"]})
    lines = [
        f"# Cache on vs off: {meta['path']} over HTTPS ({meta['started']})",
        "",
        f"`{meta['command']}`: {meta['rounds']} rounds × {meta['duration_s']} s per run, "
        f"{meta['warmup_s']} s warm-up, wrk {meta['threads']} threads; machine: {meta['cores']} cores, "
        f"load average before {meta['load_before']}.",
        "",
        markdown_table(["connections", "req/s on", "req/s off", "on/off (median, range over rounds)"],
                       [[n, s["rps_on"], s["rps_off"], f"{s['ratio_median']}× ({s['ratio_min']}–{s['ratio_max']})"]
                        for n, s in summary.items()]),
        "", "Every run (CPU in milliseconds per request, whole process trees):", "",
        markdown_table(
            ["round", "connections", "cache", "req/s", "p50 ms", "p99 ms", "hit ratio", "errors"]
            + [f"CPU {n}" for n in names] + ["CPU rest"],
            [[r["round"], r["connections"], r["cache"], r["rps"], r["p50_ms"], r["p99_ms"],
              None if r["hit_ratio"] is None else f"{100 * r['hit_ratio']:.1f}%", r["errors"],
              *(r["cpu_ms_per_request"].get(n) for n in names), r["other_cpu_ms_per_request"]] for r in runs]),
    ]
    return "\n".join(lines) + "\n"


def plot(runs, counts, path):
    """Bar chart of requests/s (log scale) per connection count, on and off, every round a dot."""

    fig, ax = new_figure(figsize=(6, 4))
    for i, mode in enumerate(("off", "on")):
        xs = [j + (i - 0.5) * 0.35 for j in range(len(counts))]
        medians = [statistics.median(r["rps"] for r in runs if r["connections"] == n and r["cache"] == mode)
                   for n in counts]
        ax.bar(xs, medians, width=0.35, label=f"cache {mode}")
        for x, n in zip(xs, counts):
            dots = [r["rps"] for r in runs if r["connections"] == n and r["cache"] == mode]
            ax.plot([x] * len(dots), dots, "k.", markersize=4)
    ax.set_yscale("log")
    ax.set_xticks(range(len(counts)), [f"{n} connections" for n in counts])
    ax.set_ylabel("requests/s (log scale)")
    ax.set_title("Anonymous page over HTTPS: cache on vs off")
    ax.legend()
    save_figure(fig, path)


@exits_2_when_not_ready("cachebench")
def main(argv=None):
    args = parse_args(argv)
    config = load_stack(args.stack_config)
    if not config.get("cache") or not config.get("tls_url"):
        raise NotReady("needs a stack with a cache tier and tls-bind ([haproxy] cache = varnish)")
    wrk = require_wrk()
    meta = {
        "command": "python -m loadtests cache " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "path": args.path, "rounds": args.rounds, "duration_s": args.duration, "warmup_s": args.warmup,
        "threads": args.threads, "cores": psutil.cpu_count(),
        "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    runs = []
    total = args.rounds * len(args.connections) * 2
    try:
        for k in range(1, args.rounds + 1):
            order = (True, False) if k % 2 else (False, True)
            for n in args.connections:
                for on in order:
                    result = measure(args, config, wrk, on, n)
                    result["round"] = k
                    runs.append(result)
                    hit = "-" if result["hit_ratio"] is None else f"{100 * result['hit_ratio']:.1f}%"
                    print(f"[{len(runs)}/{total}] round {k}, {n} connections, cache {result['cache']}: "
                          f"{result['rps']} req/s, p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
                          f"hits {hit}, errors {result['errors']}", flush=True)
    except (RollingError, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"cachebench: {exc}", file=sys.stderr)
        return 2
    finally:
        try:
            set_cache(config, True)
        except (RollingError, OSError) as exc:
            print(f"cachebench: could not put varnish back in service: {exc}", file=sys.stderr)
    summary = summarize(runs, args.connections)
    directory = report_folder(args.out, "cachebench")
    text = markdown(meta, runs, summary)
    write_report(directory, {"meta": meta, "summary": summary, "runs": runs}, text,
                 [("cachebench.png", lambda path: plot(runs, args.connections, path))])
    print(text)
    print(f"report: {directory}")
    return 1 if any(r["errors"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
