"""The matrix report's ratios per round and summary tables: server against server, threads,
ZEO clients behind HAProxy, ``blob-sendfile`` on/off, ``zodb-cache-size`` against the build's,
each with its spread over rounds.
"""
from statistics import geometric_mean

from loadtests.core.stats import format_spread, spread
from loadtests.matrix.matrix_plan import cell_of
from loadtests.matrix.matrix_rows import _errors, _flags, _fmt, default_threads_rows, is_base


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


def cache_ratios(records):
    """``{Cell: [ratio, ...]}``: req/s of each cell with a zodb-cache-size of its own over the
    same cell with the build's, per round (:func:`ratios_to`)."""
    return ratios_to(records, lambda cell: cell._replace(cache=0) if cell.cache else None)


def thread_round_ratios(records, sweep, single_threaded):
    """``{Cell: [ratio, ...]}``: req/s of each multi-threaded server's direct, default-built
    cell at ``sweep`` connections and threads other than 2 over the same cell at 2, per
    round (:func:`ratios_to`)."""
    def partner(cell):
        if (cell.connections == sweep and cell.threads != 2 and cell.server not in single_threaded
                and is_base(cell._asdict())):
            return cell._replace(threads=2)
        return None
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
    """The tables docs/results.md embeds (markdown), from the cell rows:

    - per connection count, each server at its default threads against each path:
      ``req/s / errors / p99 ms`` (errors: socket errors + non-2xx over all runs), then the
      cell's marks (``U`` not steady, ``B`` backlog, ``!`` noisy), peak RSS of its Zope
      and hello processes (MiB) and its CPU ms per ``/`` request;
    - with ``records`` (the runs) of pyruvate and waitress: pyruvate's req/s over
      waitress's per round (:func:`round_ratios`: median and min–max of the rounds);
    - at ``meta["sweep_at"]`` connections, req/s of each multi-threaded server and Zope path
      by threads, with the peak RSS (MiB) at each, and the geometric mean and range of
      the ratios to 2 threads (:func:`thread_ratios`), and with ``records`` each cell's
      req/s over its 2 threads' per round (:func:`thread_round_ratios`);
    - blob-sendfile on against off (:func:`sendfile_summary`), the cells through HAProxy by
      client count (:func:`clients_summary`) and zodb-cache-size against the build's
      (:func:`cache_summary`), when the matrix has them.
    Paths or servers without cells are left out.
    """
    paths = [p for p in meta["paths"] if any(r["path"] == p for r in rows)]
    defaults = default_threads_rows(rows, single_threaded)
    cell = {(r["server"], r["path"], r["connections"]): r for r in defaults}
    servers = [s for s in meta["servers"] if any(r["server"] == s for r in defaults)]
    zope_paths = [p for p in paths if p != "hello"]
    lines = ["## Summary (the tables of docs/results.md)", "",
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
    lines += sendfile_summary(rows, records) + clients_summary(rows, records) + cache_summary(rows, records)
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
        per_round = thread_round_ratios(records, sweep, single_threaded)
        if per_round:
            others = [t for t in swept if t != 2]
            lines += ["Per round, req/s over the same cell's at 2 threads: median (min–max); above 1 more "
                      "threads served more.", "",
                      "| server | path | " + " | ".join(f"{t}/2" for t in others) + " |",
                      "|---|---|" + "---:|" * len(others)]
            for server, path in sorted({(c.server, c.path) for c in per_round}):
                texts = [_ratio_spread(next((v for c, v in per_round.items() if (c.server, c.path, c.threads)
                                             == (server, path, t)), [])) for t in others]
                lines.append(f"| {server} | `{path}` | " + " | ".join(texts) + " |")
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


def _pairs(ratios, rows, partner):
    """``(cell, its row, partner(cell)'s row, "direct" or "HAProxy, n clients")`` for each cell
    of ``ratios`` (``{Cell: [ratio, ...]}``) in order whose rows both are in ``rows``."""
    by = {cell_of(r): r for r in rows}
    for cell in sorted(ratios):
        mine, other = by.get(cell), by.get(partner(cell))
        if mine and other:
            yield cell, mine, other, (f"HAProxy, {cell.clients} client{'s' if cell.clients != 1 else ''}"
                                      if cell.clients else "direct")


def sendfile_summary(rows, records):
    """Markdown lines: per blob cell measured with blob-sendfile on and off, req/s of each
    and on/off per round (median, min–max); [] without such pairs."""
    ratios = sendfile_ratios(records)
    if not ratios:
        return []
    lines = ["### blob-sendfile on / off on the blob", "",
             "req/s with the filter on and off (marks as above), and on/off per round: median (min–max); "
             "above 1 the filter served more.", "",
             "| server (threads) | via | conns | on req/s | off req/s | on/off |", "|---|---|---:|---:|---:|---:|"]
    for cell, on, off, via in _pairs(ratios, rows, lambda cell: cell._replace(sendfile=False)):
        lines.append(f"| {cell.server} ({cell.threads}) | {via} | {cell.connections:,} "
                     f"| {_fmt(on['rps'])} {_flags(on)}".rstrip() + f" | {_fmt(off['rps'])} {_flags(off)}".rstrip()
                     + f" | {_ratio_spread(ratios[cell])} |")
    return lines + [""]


def cache_summary(rows, records):
    """Markdown lines: per cell measured with a zodb-cache-size of its own, its req/s, the
    same cell's with the build's cache, and their ratio per round (median, min–max), with
    the peak RSS of both; [] without such cells."""
    ratios = cache_ratios(records)
    if not ratios:
        return []
    lines = ["### zodb-cache-size against the build's", "",
             "req/s with the cell's zodb-cache-size (objects per ZODB connection) and with the build's (marks as "
             "above), their ratio per round: median (min–max), above 1 the cell's size served more; peak RSS MiB "
             "of both.", "",
             "| server (threads) | path | via | conns | zodb-cache-size | req/s | build's req/s | ratio "
             "| peak RSS MiB |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for cell, mine, build, via in _pairs(ratios, rows, lambda cell: cell._replace(cache=0)):
        lines.append(f"| {cell.server} ({cell.threads}) | `{cell.path}` | {via} | {cell.connections:,} "
                     f"| {cell.cache:,} | {_fmt(mine['rps'])} {_flags(mine)}".rstrip()
                     + f" | {_fmt(build['rps'])} {_flags(build)}".rstrip()
                     + f" | {_ratio_spread(ratios[cell])} | {mine['peak_rss_mib']:.0f} / {build['peak_rss_mib']:.0f} |")
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
