"""Aggregate the benchmark matrix's runs into cells; write matrix.csv, matrix.json, PNGs
and report.md.

Per cell (server, threads, path, connections, clients, sendfile, cache:
loadtests.matrix.matrix_plan.Cell),
from its runs (results.jsonl records):

- trimmed mean (drop the highest and the lowest run, mean of the rest: of 4 runs the
  middle two) of ``rps`` (requests/s), ``p50_ms``, ``p95_ms``, ``p99_ms``, ``max_ms``
  (milliseconds) and ``cpu_ms_per_req`` (server CPU milliseconds per request);
- summed over all runs: ``requests``, socket errors by kind (``err_connect``,
  ``err_read``, ``err_write``, ``err_timeout``) and ``non_2xx``;
- ``peak_rss_mib``: largest peak RSS of the server's process tree over the runs (MiB);
- ``foreign_pct``: mean foreign CPU over the runs (% of all cores); ``noisy`` when it is
  above the threshold;
- ``drain_s``: mean idle wait before the runs (s); ``backlog`` when a wait hit its cap;
- ``duration_s``: mean length of the runs (s; steady-state runs differ per cell);
  ``req_per_conn``: the fewest requests per connection of any run (requests / connections);
  ``steady`` when every run reached the matrix's requests per connection
  (matrix_plan.steady): otherwise the cell saw mostly first responses, and its req/s and
  latencies are bounds, not the server's steady state;
- ``share``: for a cell through HAProxy (``clients`` >= 1), each ZEO client's mean part
  of HAProxy's sessions over the runs.

The ratios and summary tables are in ``loadtests.matrix.matrix_summary``, what both say of
a row in ``loadtests.matrix.matrix_rows``.
"""
import csv
import json
import os

import matplotlib.ticker

from loadtests.core.reports import new_figure, save_figure
from loadtests.loggedin import LOGGED_IN
from loadtests.matrix.matrix_plan import cell_of, steady, trimmed_mean
from loadtests.matrix.matrix_rows import ERROR_KINDS, _errors, _fmt, default_threads_rows, label
from loadtests.matrix.matrix_summary import summary


TRIMMED = ("rps", "p50_ms", "p95_ms", "p99_ms", "max_ms", "cpu_ms_per_req")
COLUMNS = (["server", "threads", "path", "connections", "clients", "sendfile", "cache", "runs"] + list(TRIMMED)
           + ["requests"] + [f"err_{k}" for k in ERROR_KINDS]
           + ["non_2xx", "peak_rss_mib", "foreign_pct", "noisy", "drain_s", "backlog", "duration_s",
              "req_per_conn", "steady", "share"])


def aggregate(records, noisy_pct, per_connection=3, duration=1):
    """Cell rows (dicts with the keys of COLUMNS), sorted by server, path, connections,
    threads, from results.jsonl ``records``. ``noisy_pct``: foreign CPU threshold (%);
    ``per_connection``: requests per connection a steady run reaches; ``duration``: run
    length (s) of records written before runs stored theirs."""
    by_cell = {}
    for r in records:
        by_cell.setdefault(cell_of(r), []).append(r)
    rows = []
    for cell, runs in by_cell.items():
        row = dict(cell._asdict(), runs=len(runs))
        conns = cell.connections
        for key in TRIMMED:
            value = trimmed_mean([r[key] for r in runs])
            row[key] = None if value is None else round(value, 3 if key == "cpu_ms_per_req" else 1)
        row["requests"] = sum(r["requests"] for r in runs)
        for kind in ERROR_KINDS:
            row[f"err_{kind}"] = sum(r["errors"][kind] for r in runs)
        row["non_2xx"] = sum(r["non_2xx"] for r in runs)
        row["peak_rss_mib"] = round(max(r["peak_rss_bytes"] for r in runs) / 2**20, 1)
        row["foreign_pct"] = round(sum(r["foreign_pct"] for r in runs) / len(runs), 1)
        row["noisy"] = row["foreign_pct"] > noisy_pct
        row["drain_s"] = round(sum(r.get("drain_before_s", 0.0) for r in runs) / len(runs), 1)
        row["backlog"] = any(r.get("backlog", False) for r in runs)
        row["duration_s"] = round(sum(r.get("duration_s", duration) for r in runs) / len(runs), 1)
        fewest = min(r["requests"] for r in runs)
        row["req_per_conn"] = round(fewest / conns, 1)
        row["steady"] = steady(fewest, conns, per_connection)
        shares = [r["share"] for r in runs if r.get("share")]
        row["share"] = {name: round(sum(s.get(name, 0.0) for s in shares) / len(shares), 3)
                        for name in sorted({n for s in shares for n in s})} if shares else None
        rows.append(row)
    rows.sort(key=lambda r: (r["server"], r["path"], r["connections"], r["threads"], r["clients"],
                             not r["sendfile"], r["cache"]))
    return rows


def write_csv(rows, path):
    """One line per cell, columns COLUMNS."""
    with open(path, "w", newline="", encoding="utf-8") as fp:
        writer = csv.DictWriter(fp, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def write_json(rows, meta, path):
    """``{"meta": meta, "cells": rows}``."""
    with open(path, "w", encoding="utf-8") as fp:
        json.dump({"meta": meta, "cells": rows}, fp, indent=1)


def plot(rows, paths, single_threaded, directory):
    """One PNG per path (``matrix-<path>.png``): req/s, p99 latency, errors (socket errors
    + non-2xx, per run) and peak RSS against connections, one line per server (at its
    default threads; other clients or blob-sendfile values are lines of their own), and
    ``matrix-clients.png`` (:func:`plot_clients`) when the cells have several client
    counts behind HAProxy. Returns the file names written."""
    all_rows = rows

    rows = default_threads_rows(rows, single_threaded, base_only=False)
    written = []
    for path in paths:
        cells = [r for r in rows if r["path"] == path]
        if not cells:
            continue
        fig, axes = new_figure(2, 2, figsize=(12, 8))
        panels = [("rps", "requests/s", lambda r: r["rps"]),
                  ("p99", "p99 latency (ms)", lambda r: r["p99_ms"]),
                  ("errors", "errors per run (socket + non-2xx)",
                   lambda r: _errors(r) / r["runs"]),
                  ("rss", "peak RSS (MiB)", lambda r: r["peak_rss_mib"])]
        for ax, (_, ylabel, value) in zip(axes.flat, panels):
            for name in sorted({label(r) for r in cells}):
                points = sorted((r["connections"], value(r)) for r in cells if label(r) == name)
                points = [(x, y) for x, y in points if y is not None]
                if points:
                    ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name,
                            linestyle="-" if "sendfile off" not in name else "--")
            ax.set_xscale("log")
            # the connection counts themselves as ticks, written plainly (not 2×10⁰)
            ax.set_xticks(sorted({r["connections"] for r in cells}))
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("editors (Locust users)" if path == LOGGED_IN else "connections (wrk)")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
        axes.flat[0].legend(fontsize="small")
        fig.suptitle(f"{path}: per server at its default threads (2; bjoern, gevent 1)")
        name = "matrix-" + ("root" if path == "/" else path.strip("/@").lower()) + ".png"
        save_figure(fig, os.path.join(directory, name), dpi=80)
        written.append(name)
    if len({r["clients"] for r in all_rows if r["clients"]}) > 1:
        written.append(plot_clients(all_rows, directory))
    return written


def plot_clients(rows, directory):
    """``matrix-clients.png``: req/s against the number of ZEO clients behind HAProxy, one
    line per server, threads, path and connection count; returns the file name."""
    balanced = [r for r in rows if r["clients"]]
    fig, ax = new_figure(figsize=(7, 4.5))
    for key in sorted({(label(dict(r, clients=0)), r["threads"], r["path"], r["connections"]) for r in balanced}):
        mine = sorted((r for r in balanced if (label(dict(r, clients=0)), r["threads"], r["path"],
                                               r["connections"]) == key), key=lambda r: r["clients"])
        name, threads, path, conns = key
        ax.plot([r["clients"] for r in mine], [r["rps"] for r in mine], marker="o",
                label=f"{name}, threads {threads}, {path}, {conns} conn.")
    ax.set_xlabel("ZEO clients behind HAProxy (leastconn)")
    ax.set_ylabel("requests/s")
    ax.set_xticks(sorted({r["clients"] for r in balanced}))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("req/s by ZEO clients")
    save_figure(fig, os.path.join(directory, "matrix-clients.png"), dpi=80)
    return "matrix-clients.png"


def markdown(rows, meta, pngs):
    """report.md text: the settings, noisy cells, and a table per path."""
    noisy = [r for r in rows if r["noisy"]]
    per_connection = meta.get("requests_per_connection", 0)
    longest = meta.get("max_duration_s") or meta["duration_s"]
    if per_connection and longest > meta["duration_s"]:
        length = (f"of {meta['duration_s']}-{longest} s (long enough for {per_connection} requests per "
                  "connection at the cell's rate)")
    else:
        length = f"of {meta['duration_s']} s"
    unsteady = [r for r in rows if not r["steady"]]
    lines = [
        "# Benchmark matrix" + ("" if meta.get("subcommand", "matrix") == "matrix"
                                else f": {meta['subcommand']} (python -m loadtests {meta['subcommand']})"),
        "",
        f"Started {meta['started']}; {meta['cores']} cores; servers {', '.join(meta['servers'])}; "
        f"{meta['runs']} runs per cell {length} after a {meta['warmup_s']} s warm-up, "
        f"in randomized interleaved order (seed {meta['seed']}); figures are the mean of the runs "
        "without the highest and the lowest (errors, requests: sums; RSS: peak). wrk timeout "
        f"{meta['timeout_s']} s. {meta['cells_done']} of {meta['cells_planned']} cells measured, "
        f"{meta['runs_done']} of {meta['runs_planned']} runs; this invocation took "
        f"{meta.get('wall_s', 0) / 60:.1f} min (estimate {meta['estimate_s'] / 60:.1f} min).",
        "",
        f"Noisy cells (foreign CPU above {meta['noisy_pct']} % of the machine, marked `!`): "
        f"{len(noisy)} of {len(rows)}. Cells with a run that started while the server still worked "
        f"off requests abandoned by an earlier run (idle wait cut at {meta.get('drain_max_s')} s, "
        f"marked `B`): {sum(1 for r in rows if r['backlog'])}. Cells with a run in which the "
        f"connections completed fewer than {per_connection or 3} requests each on average (not the "
        f"steady state: req/s and latencies are bounds; marked `U`): {len(unsteady)}.",
        "",
    ]
    for name in pngs:
        lines.append(f"![{name}]({name})")
    for path in meta["paths"]:
        cells = [r for r in rows if r["path"] == path]
        if not cells:
            continue
        lines += ["", f"## {path}", ""]
        if path == LOGGED_IN:
            lines += ["Locust's logged-in shape, not wrk: conns = editors, each in a closed loop of the front page "
                      "as a Member, the folder contents, the edit form of a document of its own and its save (req/s "
                      "counts the four; their logins in 3 uncounted seconds before each run, and the CPU counted "
                      "from then on); non-2xx = Locust's failures (a status other than 200 or a body that failed "
                      "its check, connection errors included).", ""]
        lines += ["| server | threads | conns | req/s | p50 ms | p95 ms | p99 ms | max ms | CPU ms/req "
                  "| socket errors c/r/w/t | non-2xx | peak RSS MiB | foreign CPU % | idle wait s | run s "
                  "| req/conn | runs |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in cells:
            errors = "/".join(str(r[f"err_{k}"]) for k in ERROR_KINDS)
            lines.append(
                f"| {label(r)} | {r['threads']} | {r['connections']} | {_fmt(r['rps'])} "
                f"| {_fmt(r['p50_ms'])} | {_fmt(r['p95_ms'])} | {_fmt(r['p99_ms'])} | {_fmt(r['max_ms'])} "
                f"| {'' if r['cpu_ms_per_req'] is None else r['cpu_ms_per_req']} | {errors} "
                f"| {r['non_2xx']} | {r['peak_rss_mib']} | {r['foreign_pct']}{' !' if r['noisy'] else ''} "
                f"| {r['drain_s']}{' B' if r['backlog'] else ''} | {r['duration_s']} "
                f"| {r['req_per_conn']}{'' if r['steady'] else ' U'} | {r['runs']} |")
    return "\n".join(lines) + "\n"


def write_all(records, meta, directory, single_threaded):
    """Write matrix.csv, matrix.json, matrix-<path>.png and report.md into ``directory``;
    returns the cell rows."""
    rows = aggregate(records, meta["noisy_pct"], meta.get("requests_per_connection") or 3, meta["duration_s"])
    write_csv(rows, os.path.join(directory, "matrix.csv"))
    write_json(rows, meta, os.path.join(directory, "matrix.json"))
    pngs = plot(rows, meta["paths"], single_threaded, directory)
    with open(os.path.join(directory, "report.md"), "w", encoding="utf-8") as fp:
        fp.write(markdown(rows, meta, pngs) + "\n" + summary(rows, meta, single_threaded, records))
    return rows
