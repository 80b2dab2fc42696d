"""Blob download benchmark: each client with and without the ``blobsendfile`` filter.

Usage (stack running with the site, ``make start``; ``wrk`` installed)::

    .venv/bin/python -m loadtests.blobbench [--connections 1,2,4,8] [--duration 10]
        [--rounds 3] [--variants pyruvate-on,pyruvate-off,waitress-on,waitress-off]
        [--fd-downloads 10000] [--out var/reports]

Variants: ``<server>-on`` is the stack's own client of that server (built with
``blob-sendfile = on``, the default); ``<server>-off`` is the same client part built with
``blob-sendfile = off`` by a small extra buildout in ``var/blobbench/`` (``<part>-off`` on
the client's port + number of clients, e.g. 9183 and 9184 next to 9181 and 9182), started
for the run next to the stack (same ZEO server, same blob storage) and stopped again at
the end. Optional: ``haproxy-on`` is the stack's HAProxy (both clients behind it),
``haproxy-off`` a second HAProxy part in the extra buildout in front of the ``-off``
clients (next free ports, e.g. 9185 and stats 9186); their server CPU is HAProxy's plus
the clients'. Steps:

1. checks every variant: sha256 of a whole download equals the blob file on disk,
   ``Content-Length`` is 5 MiB, a ``Range`` request is answered 206 with the right slice;
2. runs ``wrk`` (one thread, ``--duration`` s) on ``/Plone/blob-5mb/@@download/file`` of each
   variant directly, for each connection count, in ``--rounds`` rounds; within a round the
   variants take turns (the order rotates each round), so a slow minute of the machine hits
   them alike. For each run: req/s, GB/s (10^9 bytes of blob per second, completed responses
   only), p50/p99 latency, errors, CPU seconds of the server, of wrk, and of everything else
   on the machine ("foreign" load: other users' processes);
3. descriptor check: ``--fd-downloads`` downloads (wrk, 4 connections) plus 50 aborted ones
   on each ``-on`` client directly and through HAProxy; the clients' open descriptors (count
   of ``/proc/PID/fd``) and RSS before and after;
4. writes ``<out>/blobbench-<YYYYmmdd-HHMMSS>/`` with ``runs.csv`` (every run),
   ``summary.csv`` (medians per variant and connection count), ``report.json``,
   ``report.md`` and ``blobbench.png``; prints the summary and the ratios.

Exit status 0 when every check passed and no request failed, 1 otherwise, 2 when the stack
or wrk is missing or an option is invalid.
"""
import csv
import hashlib
import json
import os
import platform
import socket
import statistics
import struct
import sys
import time
import urllib.request
from datetime import datetime, timezone

import psutil

from loadtests import extrabuild, offclients
from loadtests.core import (BLOB_SIZE, PATHS, ROOT, add_buildout_config_argument, add_counts_argument,
                            add_run_arguments, add_stack_arguments, client_facts, client_urls, cpu_seconds,
                            default_buildout_config, exits_2_when_not_ready, load_stack, machine_busy_seconds,
                            new_figure, new_parser, own_cpu_seconds, require_wrk, run_wrk, save_figure,
                            stack_pids, wait_for_quiet)
BLOB_PATH = PATHS["blob"][0]
WORK_DIR = os.path.join(ROOT, "var", "blobbench")


# ----------------------------------------------------------------------------- variants

class Variant:
    """One configuration under test: a client part (or an HAProxy and its clients), its URL
    and the processes whose CPU time is the server's."""

    def __init__(self, name, part, server, sendfile, url, run_config, names):
        self.name, self.part, self.server, self.sendfile = name, part, server, sendfile
        self.url, self.run_config, self.names = url, run_config, names

    @property
    def blob_url(self):
        return self.url + BLOB_PATH

    def processes(self):
        """psutil processes of ``names``, as the supervisord of ``run_config`` has them;
        KeyError when one does not run."""
        procs = stack_pids(self.run_config)
        return [procs[name] for name in self.names]

    def process(self):
        """The first process: the client (or HAProxy)."""
        return self.processes()[0]


# ----------------------------------------------------------------------------- checks

def fetch(url, headers=None, timeout=60):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.status, answer.headers, answer.read()  # headers: case-insensitive


def reference_blob():
    """The newest 5 MiB ``.blob`` file of the blob storage (what every download must equal)."""
    import glob

    files = [p for p in glob.glob(os.path.join(ROOT, "var", "blobstorage", "**", "*.blob"), recursive=True)
             if os.path.getsize(p) == BLOB_SIZE]
    if not files:
        raise RuntimeError("no 5 MiB blob in var/blobstorage: run 'make site'")
    with open(max(files, key=os.path.getmtime), "rb") as fp:
        return fp.read()


def check_variant(variant, reference):
    """Return a list of problems (empty: whole file, length and a Range slice correct)."""
    problems = []
    status, headers, body = fetch(variant.blob_url)
    if status != 200 or int(headers.get("Content-Length", -1)) != BLOB_SIZE:
        problems.append(f"status {status}, Content-Length {headers.get('Content-Length')}")
    if hashlib.sha256(body).digest() != hashlib.sha256(reference).digest():
        problems.append("sha256 of the download differs from the blob file")
    status, headers, body = fetch(variant.blob_url, {"Range": "bytes=1000-1999"})
    if status != 206 or body != reference[1000:2000] or headers.get("Content-Range") != f"bytes 1000-1999/{BLOB_SIZE}":
        problems.append(f"Range bytes=1000-1999: status {status}, {len(body)} bytes")
    return problems


# ----------------------------------------------------------------------------- measuring

def measure(variant, connections, duration, procs, threads=1):
    """One wrk run against ``variant``; return a row dict (see runs.csv)."""
    servers = variant.processes()
    server_before = sum(sum(p.cpu_times()[:2]) for p in servers)
    ours_before = cpu_seconds(procs)
    busy_before, me_before = machine_busy_seconds(), own_cpu_seconds()
    wall_before = time.monotonic()
    out = run_wrk(variant.blob_url, connections, duration, threads=threads)
    wall = time.monotonic() - wall_before
    busy = machine_busy_seconds() - busy_before
    wrk_cpu = out["cpu_s"]
    me = own_cpu_seconds() - me_before - wrk_cpu
    server_cpu = sum(sum(p.cpu_times()[:2]) for p in servers) - server_before
    ours_after = cpu_seconds(procs)
    ours = sum(ours_after.get(n, 0) - v for n, v in ours_before.items())  # stack + off clients
    foreign = max(busy - ours - wrk_cpu - me, 0.0)
    seconds = out["duration_us"] / 1e6
    errors = sum(out["errors"].values())
    rps = out["requests"] / seconds
    return {
        "variant": variant.name, "server": variant.server, "sendfile": variant.sendfile,
        "connections": connections, "requests": out["requests"], "seconds": round(seconds, 2),
        "req_s": round(rps, 1),
        "gb_s": round(rps * BLOB_SIZE / 1e9, 3),
        "p50_ms": round(out["latency_us"]["p50"] / 1000, 1),
        "p99_ms": round(out["latency_us"]["p99"] / 1000, 1),
        "errors": errors,
        "short_bytes": out["bytes"] < out["requests"] * BLOB_SIZE,
        "server_cpu_ms_per_req": round(1000 * server_cpu / max(out["requests"], 1), 2),
        "server_cores": round(server_cpu / wall, 2),
        "wrk_cores": round(wrk_cpu / wall, 2),
        "foreign_cores": round(foreign / wall, 2),
        "machine_busy_cores": round(busy / wall, 2),
    }


def abort_download(url, keep=65536):
    """Start a download of ``url``, read ``keep`` bytes, then reset the connection (RST,
    not FIN: the client vanishes). Used here and by tests/test_blob_sendfile.py and
    tests/test_reliability.py; raises ``OSError`` if the server cannot be reached."""
    host_port = url.split("/")[2]
    host, port = host_port.rsplit(":", 1)
    path = "/" + url.split("/", 3)[3]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n".encode())
        got = 0
        while got < keep:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += len(chunk)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def descriptor_check(label, url, clients, downloads):
    """``downloads`` downloads (wrk, 4 connections, repeated until done) and 50 aborted ones
    through ``url``; return descriptor counts and RSS of ``clients`` ({name: Process})."""
    def snapshot():
        return ({n: p.num_fds() for n, p in clients.items()},
                {n: round(p.memory_info().rss / 2**20, 1) for n, p in clients.items()})

    fetch(url)
    fds_before, rss_before = snapshot()
    done, errors, started = 0, 0, time.monotonic()
    chunk_seconds = 5
    while done < downloads:
        out = run_wrk(url, 4, chunk_seconds)
        done += out["requests"]
        rate = max(done / (time.monotonic() - started), 1.0)
        chunk_seconds = int(min(max((downloads - done) / rate + 1, 2), 30))
        errors += sum(out["errors"].values())
        print(f"  {label}: {done}/{downloads} downloads, {time.monotonic() - started:.0f} s", flush=True)
    for _ in range(50):
        abort_download(url)
    deadline = time.monotonic() + 20
    while True:
        fds_after, rss_after = snapshot()
        if all(fds_after[n] <= fds_before[n] for n in clients) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    leaked = {n: fds_after[n] - fds_before[n] for n in clients}
    return {
        "target": label, "downloads": done, "aborted": 50, "errors": errors,
        "seconds": round(time.monotonic() - started, 1),
        "fds_before": fds_before, "fds_after": fds_after,
        "rss_mib_before": rss_before, "rss_mib_after": rss_after,
        "ok": errors == 0 and all(v <= 2 for v in leaked.values()),
    }


# ----------------------------------------------------------------------------- report

def summarize(runs, max_foreign):
    """Medians per (variant, connections): over the quiet runs (other processes used at most
    ``max_foreign`` cores) if there are any, else over all runs of that row."""
    groups = {}
    for row in runs:
        groups.setdefault((row["variant"], row["connections"]), []).append(row)
    summary = []
    for (variant, connections), every in groups.items():
        quiet = [r for r in every if r["foreign_cores"] <= max_foreign]
        rows = quiet or every
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("req_s", "gb_s", "p50_ms", "p99_ms", "server_cpu_ms_per_req")}
        med["foreign_cores"] = statistics.median(r["foreign_cores"] for r in every)
        summary.append({
            "variant": variant, "server": every[0]["server"], "sendfile": every[0]["sendfile"],
            "connections": connections, "quiet_runs": len(quiet), "runs": len(every),
            "req_s": round(med["req_s"], 1), "req_s_min": min(r["req_s"] for r in rows),
            "req_s_max": max(r["req_s"] for r in rows), "gb_s": round(med["gb_s"], 3),
            "gb_s_max": max(r["gb_s"] for r in rows),
            "p50_ms": round(med["p50_ms"], 1), "p99_ms": round(med["p99_ms"], 1),
            "server_cpu_ms_per_req": round(med["server_cpu_ms_per_req"], 2),
            "foreign_cores": round(med["foreign_cores"], 2),
            "errors": sum(r["errors"] for r in rows),
        })
    return summary


def ratios(summary):
    """Ratios of median req/s per connection count: on/off per server, pyruvate/waitress."""
    by = {(s["variant"], s["connections"]): s["req_s"] for s in summary}
    out = []
    for connections in sorted({s["connections"] for s in summary}):
        row = {"connections": connections}
        for label, a, b in (("pyruvate on/off", "pyruvate-on", "pyruvate-off"),
                            ("waitress on/off", "waitress-on", "waitress-off"),
                            ("haproxy on/off", "haproxy-on", "haproxy-off"),
                            ("pyruvate-on/waitress-on", "pyruvate-on", "waitress-on"),
                            ("pyruvate-on/waitress-off", "pyruvate-on", "waitress-off"),
                            ("pyruvate-off/waitress-off", "pyruvate-off", "waitress-off")):
            if by.get((a, connections)) and by.get((b, connections)):
                row[label] = round(by[(a, connections)] / by[(b, connections)], 2)
        out.append(row)
    return out


def write_csv(path, rows):
    if not rows:
        return
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="", encoding="utf-8") as fp:
        writer = csv.DictWriter(fp, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def table(summary):
    lines = ["| variant | conns | quiet/runs | req/s (min-max) | GB/s | p50 ms | p99 ms | server CPU ms/req | foreign cores |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in sorted(summary, key=lambda s: (s["connections"], s["variant"])):
        lines.append(f"| {s['variant']} | {s['connections']} | {s['quiet_runs']}/{s['runs']} "
                     f"| {s['req_s']:.1f} ({s['req_s_min']:.0f}-{s['req_s_max']:.0f}) "
                     f"| {s['gb_s']:.2f} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} "
                     f"| {s['server_cpu_ms_per_req']:.2f} | {s['foreign_cores']:.2f} |")
    return "\n".join(lines)


def ratio_table(rows):
    labels = list(dict.fromkeys(k for r in rows for k in r if k != "connections"))
    lines = ["| conns | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
    for r in rows:
        lines.append(f"| {r['connections']} | " + " | ".join(f"{r.get(l, '-')}" for l in labels) + " |")
    return "\n".join(lines)


def fd_table(checks):
    lines = ["| target | downloads | aborted | errors | descriptors before → after | RSS MiB before → after | ok |",
             "|---|---:|---:|---:|---|---|---|"]
    for c in checks:
        fds = ", ".join(f"{n} {c['fds_before'][n]} → {c['fds_after'][n]}" for n in c["fds_before"])
        rss = ", ".join(f"{n} {c['rss_mib_before'][n]} → {c['rss_mib_after'][n]}" for n in c["rss_mib_before"])
        lines.append(f"| {c['target']} | {c['downloads']} | {c['aborted']} | {c['errors']} | {fds} | {rss} | "
                     f"{'yes' if c['ok'] else 'NO'} |")
    return "\n".join(lines)


def plot(summary, path):
    """Write ``path``: GB/s of the blob against wrk connections, one line per variant (median,
    min-max bars); returns ``path``, or None without matplotlib."""
    try:
        import matplotlib.ticker

        fig, ax = new_figure(figsize=(8, 5))
    except ImportError:
        return None
    styles = {"pyruvate-on": ("tab:green", "-"), "pyruvate-off": ("tab:green", "--"),
              "waitress-on": ("tab:blue", "-"), "waitress-off": ("tab:blue", "--"),
              "haproxy-on": ("tab:orange", "-"), "haproxy-off": ("tab:orange", "--")}
    for variant in sorted({s["variant"] for s in summary}):
        rows = sorted((s for s in summary if s["variant"] == variant), key=lambda s: s["connections"])
        xs = [r["connections"] for r in rows]
        ys = [r["gb_s"] for r in rows]
        lo = [max(r["gb_s"] - r["req_s_min"] * BLOB_SIZE / 1e9, 0) for r in rows]
        hi = [max(r["req_s_max"] * BLOB_SIZE / 1e9 - r["gb_s"], 0) for r in rows]
        color, line = styles.get(variant, (None, "-"))
        ax.errorbar(xs, ys, yerr=[lo, hi], label=variant, color=color, linestyle=line, marker="o", capsize=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({s["connections"] for s in summary}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("wrk connections")
    ax.set_ylabel("GB/s of 5 MiB blob (median, min-max)")
    ax.set_title("Blob downloads per client, blob-sendfile on/off")
    ax.grid(True, alpha=0.3)
    ax.legend()
    save_figure(fig, path, dpi=110)
    return path


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    parser = new_parser(
        "blob", "Blob download benchmark of each client with and without the blobsendfile "
        "filter (wrk); writes var/reports/blobbench-<timestamp>/.")
    add_counts_argument(parser, "--connections", "1,2,4,8", "wrk connection counts, comma-separated")
    add_run_arguments(parser, duration=10, rounds=3,
                      rounds_help="rounds; every variant runs once per round and connection count")
    parser.add_argument("--variants", default="pyruvate-on,pyruvate-off,waitress-on,waitress-off",
                        help="<server>-on|off, comma-separated, server pyruvate, waitress or haproxy "
                             "(the stack's HAProxy with both clients; -off: a second HAProxy in front "
                             "of the -off clients); default the four client variants")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads; default 1")
    parser.add_argument("--max-foreign", type=float, default=0.5,
                        help="before each run, wait until other processes use at most this many cores "
                             "(see --quiet-timeout); default 0.5")
    parser.add_argument("--quiet-timeout", type=float, default=30.0,
                        help="seconds to wait for --max-foreign before running anyway (0: never wait); default 30")
    parser.add_argument("--fd-downloads", type=int, default=10000,
                        help="downloads per target of the descriptor check (0: skip); default 10000")
    add_buildout_config_argument(parser, "the -off clients' buildout in var/blobbench")
    parser.add_argument("--keep-off-clients", action="store_true",
                        help="leave the -off clients running afterwards (stop: kill their PIDs in var/blobbench/run)")
    add_stack_arguments(parser)
    parser.add_argument("--report-only", metavar="DIR",
                        help="measure nothing: re-write the summary, tables and plot of DIR/report.json")
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in args.variants:
        server, _, switch = v.rpartition("-")
        if server not in ("pyruvate", "waitress", "haproxy") or switch not in ("on", "off"):
            parser.error(f"--variants: {v!r} is not <pyruvate|waitress|haproxy>-<on|off>")
    if min(args.connections) < 1 or args.duration < 1 or args.rounds < 1 or args.fd_downloads < 0:
        parser.error("--connections, --duration and --rounds must be >= 1, --fd-downloads >= 0")
    if args.buildout_config is None:
        args.buildout_config = default_buildout_config()
    return args


@exits_2_when_not_ready("blobbench")
def main(argv=None):
    """Entry point; see the module docstring."""
    args = parse_args(argv)
    if args.report_only:
        return report_only(args.report_only)
    require_wrk()
    config = load_stack(args.stack_config)
    clients = config["servers"]
    kinds = config["server_kinds"]
    urls = client_urls(config)
    procs = stack_pids(config)
    if any(c not in procs for c in clients):
        print("blobbench: the stack is not running: make start", file=sys.stderr)
        return 2
    from plonedeploy.recipe import stack as stack_runtime  # its StackError

    wanted_off = [v for v in args.variants if v.endswith("-off")]
    haproxy_name = config["haproxy_context"]["part"]
    off_clients = [c for c in clients if f"{kinds[c]}-off" in wanted_off or "haproxy-off" in wanted_off]
    ports = offclients.ports({c: urls[c] for c in clients}, len(clients))
    off_haproxy = None
    if "haproxy-off" in wanted_off:
        first = max(ports.values()) + 1
        off_haproxy = (haproxy_name, first, first + 1)
    off_config = offclients.stack_config(WORK_DIR, off_clients, ports, off_haproxy, config["haproxy_binary"])
    variants = {}
    for client in clients:
        if not client_facts(config, client)["blob_sendfile"]:
            print(f"blobbench: {client} is built with blob-sendfile = off; the -on variant needs it on",
                  file=sys.stderr)
            return 2
        variants[f"{kinds[client]}-on"] = Variant(f"{kinds[client]}-on", client, kinds[client], True, urls[client],
                                                  config, [client])
    variants["haproxy-on"] = Variant(
        "haproxy-on", haproxy_name, "haproxy", True, config["frontend_url"],
        config, [haproxy_name] + clients)
    for client in off_clients:
        variants[f"{kinds[client]}-off"] = Variant(
            f"{kinds[client]}-off", f"{client}-off", kinds[client], False, f"http://127.0.0.1:{ports[client]}",
            off_config, [f"{client}-off"])
    if off_haproxy:
        variants["haproxy-off"] = Variant(
            "haproxy-off", f"{haproxy_name}-off", "haproxy", False, f"http://127.0.0.1:{off_haproxy[1]}",
            off_config, [f"{n}-off" for n in [haproxy_name] + off_clients])
    order = [v for v in args.variants if v in variants]

    started = datetime.now(timezone.utc)
    directory = os.path.join(args.out, "blobbench-" + started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(directory, exist_ok=True)
    runs, checks, problems = [], [], []
    try:
        if off_clients:
            offclients.build(WORK_DIR, args.buildout_config, off_clients, ports, off_haproxy, "loadtests.blobbench")
            procs.update(extrabuild.start(off_config))
        reference = reference_blob()
        for name in order:
            found = check_variant(variants[name], reference)
            problems += [f"{name}: {p}" for p in found]
            print(f"check {name} ({variants[name].url}): {'ok' if not found else '; '.join(found)}", flush=True)
        for name in order:  # warm up: caches, ZODB connections
            run_wrk(variants[name].blob_url, 2, 2)

        total = args.rounds * len(args.connections) * len(order)
        print(f"{total} wrk runs of {args.duration} s: variants {', '.join(order)}; "
              f"connections {args.connections}; {args.rounds} rounds", flush=True)
        for round_no in range(args.rounds):
            for connections in args.connections:
                turn = order[round_no % len(order):] + order[:round_no % len(order)]
                for name in turn:
                    waited = wait_for_quiet(procs, args.max_foreign, args.quiet_timeout)
                    row = measure(variants[name], connections, args.duration, procs, args.wrk_threads)
                    row["round"] = round_no + 1
                    row["waited_s"] = waited
                    runs.append(row)
                    print(f"  round {round_no + 1} c={connections:<2} {name:13} {row['req_s']:7.1f} req/s "
                          f"{row['gb_s']:5.2f} GB/s p50 {row['p50_ms']:6.1f} ms p99 {row['p99_ms']:7.1f} ms "
                          f"errors {row['errors']} foreign {row['foreign_cores']:.2f} cores", flush=True)
                    if row["errors"] or row["short_bytes"]:
                        problems.append(f"{name} c={connections} round {round_no + 1}: {row['errors']} errors, "
                                        f"short bytes {row['short_bytes']}")

        if args.fd_downloads:
            on_clients = {c: variants[f"{kinds[c]}-on"].process() for c in clients}
            targets = [(f"{c} ({kinds[c]}) direct", urls[c] + BLOB_PATH) for c in clients]
            targets.append(("haproxy", config["frontend_url"] + BLOB_PATH))
            for label, url in targets:
                check = descriptor_check(label, url, on_clients, args.fd_downloads)
                checks.append(check)
                print(f"descriptors {label}: {check['fds_before']} -> {check['fds_after']} after "
                      f"{check['downloads']} downloads + {check['aborted']} aborted: "
                      f"{'ok' if check['ok'] else 'LEAK OR ERRORS'}", flush=True)
                if not check["ok"]:
                    problems.append(f"descriptor check {label} failed")
    except KeyboardInterrupt:
        problems.append("interrupted: the report has the runs done so far")
        print("\ninterrupted", flush=True)
    except (RuntimeError, OSError, stack_runtime.StackError) as exc:
        problems.append(f"stopped: {exc}")
        print(f"blobbench: {exc}", file=sys.stderr, flush=True)
    finally:
        if off_clients and not args.keep_off_clients:
            extrabuild.stop(off_config)

    meta = {
        "started": started.isoformat(timespec="seconds"),
        "host": platform.node(), "cores": psutil.cpu_count(), "cpu": platform.processor() or platform.machine(),
        "duration_s": args.duration, "rounds": args.rounds, "connections": args.connections,
        "wrk_threads": args.wrk_threads, "max_foreign": args.max_foreign,
        "quiet_timeout_s": args.quiet_timeout, "variants": {n: {"url": v.url, "part": v.part} for n, v in variants.items()},
        "blob_bytes": BLOB_SIZE, "gb": "10^9 bytes of blob per second, completed responses",
    }
    return write_report(directory, meta, runs, checks, problems)


def write_report(directory, meta, runs, checks, problems):
    """Write report.json, runs.csv, summary.csv, report.md and blobbench.png; print the
    summary; return the exit status (1 if there were problems)."""
    summary = summarize(runs, meta["max_foreign"])
    ratio_rows = ratios(summary)
    data = {"meta": meta, "summary": summary, "ratios": ratio_rows, "descriptor_checks": checks,
            "runs": runs, "problems": problems}
    with open(os.path.join(directory, "report.json"), "w", encoding="utf-8") as fp:
        json.dump(data, fp, indent=2)
    write_csv(os.path.join(directory, "runs.csv"), runs)
    write_csv(os.path.join(directory, "summary.csv"), summary)
    png = plot(summary, os.path.join(directory, "blobbench.png")) if summary else None
    md = [f"# Blob download benchmark {meta['started']}", "",
          f"{meta['cores']} cores; wrk {meta['wrk_threads']} thread(s), {meta['duration_s']} s per run, "
          f"{meta['rounds']} rounds, variants alternating. Medians (min-max of req/s) over the runs "
          f"during which other processes used at most {meta['max_foreign']} cores (\"quiet\"), or over "
          "all runs of a row when none was quiet; foreign cores: median over all its runs.", "",
          table(summary), "", "Ratios of median req/s:", "", ratio_table(ratio_rows), ""]
    if checks:
        md += ["Descriptor check (on-clients):", "", fd_table(checks), ""]
    if problems:
        md += ["Problems:", ""] + [f"- {p}" for p in problems] + [""]
    with open(os.path.join(directory, "report.md"), "w", encoding="utf-8") as fp:
        fp.write("\n".join(md))
    print()
    print(table(summary))
    print()
    print(ratio_table(ratio_rows))
    if checks:
        print()
        print(fd_table(checks))
    for p in problems:
        print(f"PROBLEM: {p}")
    print(f"report: {os.path.join(directory, 'report.md')}")
    if png:
        print(f"plot:   {png}")
    return 1 if problems else 0


def report_only(directory):
    """Re-write the summary, tables and plot of an earlier run from its report.json."""
    with open(os.path.join(directory, "report.json"), encoding="utf-8") as fp:
        data = json.load(fp)
    data["meta"].setdefault("max_foreign", 0.5)
    return write_report(directory, data["meta"], data["runs"], data["descriptor_checks"], data["problems"])


if __name__ == "__main__":
    sys.exit(main())
