"""Aggregate the benchmark matrix's runs into cells; write matrix.csv, matrix.json, PNGs
and report.md.

Per cell (server, threads, path, connections, clients, sendfile: loadtests.matrix_plan.Cell),
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
"""
import csv
import json
import os
from statistics import geometric_mean

import matplotlib.ticker

from loadtests.core import format_spread, new_figure, save_figure, spread
from loadtests.matrix_plan import cell_of, steady, trimmed_mean

TRIMMED = ("rps", "p50_ms", "p95_ms", "p99_ms", "max_ms", "cpu_ms_per_req")
ERROR_KINDS = ("connect", "read", "write", "timeout")
COLUMNS = (["server", "threads", "path", "connections", "clients", "sendfile", "runs"] + list(TRIMMED)
           + ["requests"] + [f"err_{k}" for k in ERROR_KINDS]
           + ["non_2xx", "peak_rss_mib", "foreign_pct", "noisy", "drain_s", "backlog", "duration_s",
              "req_per_conn", "steady", "share"])


def label(row):
    """A cell's server as the tables and plots name it: the wsgi-server value, then
    ``sendfile off`` and ``×n via HAProxy`` for the cells off the default axes."""
    text = row["server"]
    if not row.get("sendfile", True):
        text += " sendfile off"
    if row.get("clients", 0):
        text += f" ×{row['clients']} via HAProxy"
    return text


def is_base(row):
    """True for a direct cell of a default-built client (clients 0, sendfile on): the
    cells the per-server tables compare."""
    return not row.get("clients", 0) and row.get("sendfile", True)


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
                             not r["sendfile"]))
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


def default_threads_rows(rows, single_threaded, base_only=True):
    """The rows at each server's default threads (2, or 1 when single-threaded): one line
    per server in the per-connection plots; ``base_only``: direct to a default-built
    client only (:func:`is_base`)."""
    return [r for r in rows if r["threads"] == (1 if r["server"] in single_threaded else 2)
            and (is_base(r) or not base_only)]


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
            ax.set_xlabel("connections (wrk)")
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
    for key in sorted({(r["server"], r["threads"], r["path"], r["connections"], r["sendfile"]) for r in balanced}):
        mine = sorted((r for r in balanced if (r["server"], r["threads"], r["path"], r["connections"],
                                               r["sendfile"]) == key), key=lambda r: r["clients"])
        server, threads, path, conns, on = key
        ax.plot([r["clients"] for r in mine], [r["rps"] for r in mine], marker="o",
                label=f"{server}{'' if on else ' sendfile off'}, threads {threads}, {path}, {conns} conn.")
    ax.set_xlabel("ZEO clients behind HAProxy (leastconn)")
    ax.set_ylabel("requests/s")
    ax.set_xticks(sorted({r["clients"] for r in balanced}))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("req/s by ZEO clients")
    save_figure(fig, os.path.join(directory, "matrix-clients.png"), dpi=80)
    return "matrix-clients.png"


def _fmt(value):
    return "" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


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
        lines += ["", f"## {path}", "",
                  "| server | threads | conns | req/s | p50 ms | p95 ms | p99 ms | max ms | CPU ms/req "
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


def _flags(row):
    """The marks of a cell in the summary tables: U not steady, B backlog, ! noisy."""
    return "".join(mark for mark, on in (("U", not row["steady"]), ("B", row["backlog"]), ("!", row["noisy"])) if on)


def _errors(row):
    return sum(row[f"err_{k}"] for k in ERROR_KINDS) + row["non_2xx"]


def ratios_to(records, partner):
    """``{Cell: [ratio, ...]}``: req/s of each cell's run k over run k of ``partner(cell)``
    (a Cell, or None when the cell is not compared), for the rounds both have. The rounds
    of a matrix are interleaved in time, so run k of both cells saw the machine in about
    the same state: the spread of these ratios is the comparison's own, not the machine's
    drift."""
    rate = {(cell_of(r), r["run"]): r["rps"] for r in records if r["rps"]}
    out = {}
    for (cell, run), value in sorted(rate.items(), key=lambda item: item[0][1]):
        other = partner(cell)
        if other is not None and (other, run) in rate:
            out.setdefault(cell, []).append(value / rate[(other, run)])
    return out


def round_ratios(records, a, b, single_threaded):
    """``{(path, connections): [ratio, ...]}``: server ``a``'s req/s over ``b``'s in each
    round (:func:`ratios_to`), both at their default threads, direct to a default-built
    client, for every path and connection count both have runs of."""
    def default(server):
        return 1 if server in single_threaded else 2

    def partner(cell):
        if cell.server == a and cell.threads == default(a) and is_base(cell._asdict()):
            return cell._replace(server=b, threads=default(b))
        return None
    return {(cell.path, cell.connections): values for cell, values in ratios_to(records, partner).items()}


def sendfile_ratios(records):
    """``{Cell: [ratio, ...]}``: req/s of each blob cell with blob-sendfile on over the same
    cell with it off, per round (:func:`ratios_to`)."""
    return ratios_to(records, lambda cell: cell._replace(sendfile=False) if cell.path == "blob" and cell.sendfile
                     else None)


def client_ratios(records):
    """``{Cell: [ratio, ...]}``: req/s of each cell through HAProxy over the same cell with
    the fewest clients measured (>= 1), per round (:func:`ratios_to`); the fewest's own
    cells are not in it."""
    fewest = {}
    for r in records:
        if r.get("clients"):
            key = cell_of(r)._replace(clients=0)
            fewest[key] = min(fewest.get(key, r["clients"]), r["clients"])

    def partner(cell):
        least = fewest.get(cell._replace(clients=0))
        return cell._replace(clients=least) if cell.clients and least != cell.clients else None
    return ratios_to(records, partner)


def thread_ratios(rows, sweep, single_threaded):
    """``{threads: [ratio, ...]}``: req/s at each swept thread count over req/s at the
    default 2, one ratio per multi-threaded server and Zope path at ``sweep`` connections."""
    by = {(r["server"], r["path"], r["threads"]): r["rps"] for r in rows
          if r["connections"] == sweep and r["server"] not in single_threaded and r["path"] != "hello" and r["rps"]
          and is_base(r)}
    out = {}
    for (server, path, threads), value in by.items():
        if threads != 2 and (server, path, 2) in by:
            out.setdefault(threads, []).append(value / by[(server, path, 2)])
    return out


def summary(rows, meta, single_threaded, records=()):
    """The tables docs/benchmarks.md embeds (markdown), from the cell rows:

    - per connection count, each server at its default threads against each path:
      ``req/s / errors / p99 ms`` (errors: socket errors + non-2xx over all runs), then the
      cell's marks (``U`` not steady, ``B`` backlog, ``!`` noisy), peak RSS of its Zope
      and hello processes (MiB) and its CPU ms per ``/`` request;
    - with ``records`` (the runs) of pyruvate and waitress: pyruvate's req/s over
      waitress's per round (:func:`round_ratios`: median and min–max of the rounds);
    - at ``meta["sweep_at"]`` connections, req/s of each multi-threaded server and Zope path
      by threads, with the peak RSS (MiB) at each, and the geometric mean and range of
      the ratios to 2 threads (:func:`thread_ratios`);
    - blob-sendfile on against off (:func:`sendfile_summary`) and the cells through
      HAProxy by client count (:func:`clients_summary`), when the matrix has them.
    Paths or servers without cells are left out.
    """
    paths = [p for p in meta["paths"] if any(r["path"] == p for r in rows)]
    defaults = default_threads_rows(rows, single_threaded)
    cell = {(r["server"], r["path"], r["connections"]): r for r in defaults}
    servers = [s for s in meta["servers"] if any(r["server"] == s for r in defaults)]
    zope_paths = [p for p in paths if p != "hello"]
    lines = ["## Summary (the tables of docs/benchmarks.md)", "",
             "Each server at its default threads (2; bjoern, gevent 1). A cell: req/s / errors / p99 ms, "
             "then its marks: `U` not steady (fewer requests per connection than planned: bounds), "
             "`B` a run started on a server still busy with abandoned requests, `!` noisy (foreign CPU).", ""]
    for conns in sorted({r["connections"] for r in defaults}):
        lines += [f"### {conns:,} connection{'s' if conns != 1 else ''}", "",
                  "| server (threads) | " + " | ".join(f"`{p}`" for p in paths)
                  + " | peak RSS MiB (Zope / hello) | CPU ms per `/` request |",
                  "|---|" + "---:|" * len(paths) + "---:|---:|"]
        for server in servers:
            here = [cell.get((server, p, conns)) for p in paths]
            if not any(here):
                continue
            threads = next(r["threads"] for r in here if r)
            cells_text = ["-" if r is None else
                          f"{_fmt(r['rps'])} / {_errors(r):,} / {_fmt(r['p99_ms'])} {_flags(r)}".rstrip() for r in here]
            zope = [r["peak_rss_mib"] for r, p in zip(here, paths) if r and p != "hello"]
            hello, root = cell.get((server, "hello", conns)), cell.get((server, "/", conns))
            rss = (f"{max(zope):.0f}" if zope else "-") + " / " + (f"{hello['peak_rss_mib']:.0f}" if hello else "-")
            cpu = root["cpu_ms_per_req"] if root and root["cpu_ms_per_req"] is not None else "-"
            lines.append(f"| {server} ({threads}) | " + " | ".join(cells_text) + f" | {rss} | {cpu} |")
        lines.append("")
    ratios = round_ratios(records, "pyruvate", "waitress", single_threaded)
    if ratios:
        levels = sorted({conns for _, conns in ratios})
        lines += ["### pyruvate / waitress, req/s ratio per round", "",
                  "Median of the rounds (min–max); above 1 pyruvate served more.", "",
                  "| path | " + " | ".join(f"{c:,} conn." for c in levels) + " |",
                  "|---|" + "---:|" * len(levels)]
        for path in paths:
            cells_text = []
            for conns in levels:
                cells_text.append(_ratio_spread(ratios.get((path, conns), [])))
            lines.append(f"| `{path}` | " + " | ".join(cells_text) + " |")
        lines.append("")
    lines += sendfile_summary(rows, records) + clients_summary(rows, records)
    sweep = meta.get("sweep_at")
    swept = sorted({r["threads"] for r in rows if r["connections"] == sweep and is_base(r)}) if sweep else []
    if len(swept) > 1:
        by = {(r["server"], r["path"], r["threads"]): r for r in rows if r["connections"] == sweep and is_base(r)}
        lines += [f"### Threads at {sweep:,} connections", "",
                  "| server | path | " + " | ".join(f"{t} thread{'s' if t != 1 else ''}" for t in swept)
                  + " | peak RSS MiB (" + " / ".join(map(str, swept)) + ") |",
                  "|---|---|" + "---:|" * len(swept) + "---|"]
        for server in meta["servers"]:
            if server in single_threaded:
                continue
            for path in zope_paths:
                here = [by.get((server, path, t)) for t in swept]
                if not any(here):
                    continue
                rates = ["-" if r is None else f"{_fmt(r['rps'])} {_flags(r)}".rstrip() for r in here]
                rss = ["-" if r is None else f"{r['peak_rss_mib']:.0f}" for r in here]
                lines.append(f"| {server} | `{path}` | " + " | ".join(rates) + " | " + " / ".join(rss) + " |")
        lines.append("")
        for threads, values in sorted(thread_ratios(rows, sweep, single_threaded).items()):
            name = f"{threads} thread{'s' if threads != 1 else ''}"
            lines.append(f"{name} against 2, over {len(values)} server × path cells: geometric mean "
                         f"{geometric_mean(values):.2f} ({min(values):.2f}–{max(values):.2f}); more req/s than "
                         f"2 threads in {sum(v > 1 for v in values)} of {len(values)}.")
        lines.append("")
    return "\n".join(lines)


def _ratio_spread(values):
    """``median (min–max)`` of per-round ratios, 2 decimals (core.spread, core.format_spread)."""
    return format_spread(spread(values), 2)


def sendfile_summary(rows, records):
    """Markdown lines: per blob cell measured with blob-sendfile on and off, req/s of each
    and on/off per round (median, min–max); [] without such pairs."""
    ratios = sendfile_ratios(records)
    if not ratios:
        return []
    by = {cell_of(r): r for r in rows}
    lines = ["### blob-sendfile on / off on the blob", "",
             "req/s with the filter on and off (marks as above), and on/off per round: median (min–max); "
             "above 1 the filter served more.", "",
             "| server (threads) | via | conns | on req/s | off req/s | on/off |", "|---|---|---:|---:|---:|---:|"]
    for cell in sorted(ratios):
        on, off = by.get(cell), by.get(cell._replace(sendfile=False))
        if not on or not off:
            continue
        via = f"HAProxy, {cell.clients} client{'s' if cell.clients != 1 else ''}" if cell.clients else "direct"
        lines.append(f"| {cell.server} ({cell.threads}) | {via} | {cell.connections:,} "
                     f"| {_fmt(on['rps'])} {_flags(on)}".rstrip() + f" | {_fmt(off['rps'])} {_flags(off)}".rstrip()
                     + f" | {_ratio_spread(ratios[cell])} |")
    return lines + [""]


def clients_summary(rows, records):
    """Markdown lines: per server, threads, path and connection count measured through
    HAProxy, req/s at each client count, its ratio to the fewest clients per round
    (median, min–max) and the smallest client's share of the sessions; [] with fewer
    than two client counts through HAProxy."""
    balanced = [r for r in rows if r["clients"]]
    counts = sorted({r["clients"] for r in balanced})
    if len(counts) < 2:
        return []  # one count through HAProxy: nothing to compare (sendfile_summary shows it)
    ratios = client_ratios(records)
    lines = ["### ZEO clients behind HAProxy (leastconn, maxconn = threads)", "",
             "A cell: req/s, then × the fewest clients' req/s per round: median (min–max), then the smallest "
             "share of HAProxy's sessions any one client got (even: 1/n).", "",
             "| server (threads) | path | conns | " + " | ".join(f"{n} client{'s' if n != 1 else ''}" for n in counts)
             + " |", "|---|---|---:|" + "---:|" * len(counts)]
    groups = sorted({cell_of(r)._replace(clients=0) for r in balanced})
    by = {cell_of(r): r for r in balanced}
    for group in groups:
        texts = []
        for n in counts:
            row = by.get(group._replace(clients=n))
            if row is None:
                texts.append("-")
                continue
            text = f"{_fmt(row['rps'])} {_flags(row)}".rstrip()
            if group._replace(clients=n) in ratios:
                text += f", ×{_ratio_spread(ratios[group._replace(clients=n)])}"
            if row["share"] and n > 1:
                text += f", share ≥ {min(row['share'].values()):.2f}"
            texts.append(text)
        name = f"{group.server}{'' if group.sendfile else ' sendfile off'} ({group.threads})"
        lines.append(f"| {name} | `{group.path}` | {group.connections:,} | " + " | ".join(texts) + " |")
    return lines + [""]


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
