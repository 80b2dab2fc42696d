"""Turn one A/B run into ``report.json``, ``report.md`` and ``ab.png``.

Input: one run's measurement from ``loadtests.ab.measure.measure``, a dict of

- ``haproxy``: ``{server: {counter: delta}}`` from ``haproxy_stats.deltas``;
- ``per_server``: the locustfile's ``--per-server-stats`` JSON
  (``{"elapsed_s": s, "servers": {server: {request name: {...}}}}``);
- ``server_kinds``: ``{server: WSGI server}`` of the servers compared, in order;
- ``meta``: run parameters and machine facts (a dict, copied into the report).

Units: times in milliseconds, rates in requests/s over Locust's elapsed run time, sizes in
bytes, shares as fractions 0..1.
"""

from loadtests.core.reports import markdown_table, new_figure, save_figure, write_report
from loadtests.core.stats import histogram_percentile
from loadtests.loggedin import REQUESTS as LOGGED_IN_REQUESTS

#: Request names of the locustfile, in report order (the logged-in shape's when it ran).
PATHS = ("/", "/Plone", "@json", "blob 5MB") + tuple(LOGGED_IN_REQUESTS.values())


def _ratio(a, b):
    return a / b if b else None


def latency(histogram):
    """``{"p50_ms", "p95_ms", "p99_ms"}`` of a Locust histogram ``{rounded ms: count}``
    (see :func:`loadtests.core.stats.histogram_percentile`); None for an empty histogram."""
    return {f"p{q}_ms": histogram_percentile(histogram, q / 100) for q in (50, 95, 99)}


def _path_entry(entry, elapsed):
    return {
        "requests": entry["num_requests"],
        "failures": entry["num_failures"],
        "rps": entry["num_requests"] / elapsed,
        "avg_ms": entry["avg_ms"],
        "p50_ms": entry["p50_ms"],
        "p95_ms": entry["p95_ms"],
        "p99_ms": entry["p99_ms"],
        "max_ms": entry["max_ms"],
        "bytes": entry["total_bytes"],
    }


def build(measurement):
    """Assemble the report dict from ``loadtests.ab.measure.measure``'s measurement
    (``{"meta", "haproxy", "per_server", "server_kinds"}``; see the module docstring).

    Returns ``{"meta", "servers", "paths", "ratios", "totals"}``; ``servers[name]`` has
    ``wsgi_server``, ``haproxy`` (counter deltas), ``share`` (of HAProxy sessions),
    ``latency`` (p50/p95/p99 ms over all its paths, when the locustfile wrote
    ``server_totals``) and ``paths[name]`` with requests, failures, share (of that path's
    requests), rps, avg/p50/p95/p99/max latency and bytes.
    """
    meta, haproxy = measurement["meta"], measurement["haproxy"]
    per_server, server_kinds = measurement["per_server"], measurement["server_kinds"]
    elapsed = per_server.get("elapsed_s") or meta.get("duration_s") or 1.0
    by_server = per_server.get("servers", {})
    names = list(server_kinds) + sorted(s for s in by_server if s not in server_kinds)
    total_sessions = sum(h.get("stot", 0) for h in haproxy.values()) or 0
    total = per_server.get("total", {})
    servers = {}
    for name in names:
        paths = {}
        for path in PATHS:
            entry = by_server.get(name, {}).get(path)
            if entry:
                paths[path] = _path_entry(entry, elapsed)
                paths[path]["share"] = _ratio(entry["num_requests"], total[path]["num_requests"])
        counters = haproxy.get(name, {})
        servers[name] = {
            "wsgi_server": server_kinds.get(name, "-"),
            "haproxy": counters,
            "share": _ratio(counters.get("stot", 0), total_sessions),
            "requests": sum(p["requests"] for p in paths.values()),
            "failures": sum(p["failures"] for p in paths.values()),
            "rps": sum(p["rps"] for p in paths.values()),
            "latency": latency(per_server.get("server_totals", {}).get(name, {}).get("response_times", {})),
            "paths": paths,
        }
    paths = {path: _path_entry(total[path], elapsed) for path in PATHS if path in total}
    totals = {
        "requests": sum(p["requests"] for p in paths.values()),
        "failures": sum(p["failures"] for p in paths.values()),
        "rps": sum(p["rps"] for p in paths.values()),
        "haproxy_sessions": total_sessions,
    }
    ratios = {}
    known = [n for n in server_kinds if n in servers]
    if len(known) >= 2:
        a, b = known[0], known[1]
        key = f"{a}/{b}"
        ratios[key] = {}
        for path in PATHS:
            pa, pb = servers[a]["paths"].get(path), servers[b]["paths"].get(path)
            if pa and pb:
                ratios[key][path] = {
                    "requests": _ratio(pa["requests"], pb["requests"]),
                    "p50_ms": _ratio(pa["p50_ms"], pb["p50_ms"]),
                    "p99_ms": _ratio(pa["p99_ms"], pb["p99_ms"]),
                }
    return {"meta": meta, "servers": servers, "paths": paths, "ratios": ratios, "totals": totals}


def _fmt(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _pct(value):
    return "-" if value is None else f"{100 * value:.1f}%"


def summary_table(report):
    """Markdown table: one row per server and path (plus a total row per server)."""
    rows = []
    for name, srv in report["servers"].items():
        rows += [[name, srv["wsgi_server"], path, _fmt(p["requests"]), _pct(p["share"]), _fmt(p["rps"]),
                  _fmt(p["p50_ms"], 0), _fmt(p["p95_ms"], 0), _fmt(p["p99_ms"], 0), _fmt(p["failures"]),
                  _fmt(p["bytes"] / 2**20)] for path, p in srv["paths"].items()]
        rows.append([f"**{name}**", srv["wsgi_server"], "all", _fmt(srv["requests"]),
                     f"{_pct(srv['share'])} of HAProxy sessions", _fmt(srv["rps"]), "", "", "",
                     _fmt(srv["failures"]), ""])
    return markdown_table(["server", "WSGI server", "path", "requests", "share of path", "req/s", "p50 ms",
                           "p95 ms", "p99 ms", "failures", "MiB"], rows)


def to_markdown(report, plot_name="ab.png"):
    """Return the whole ``report.md`` text."""
    meta, totals = report["meta"], report["totals"]
    out = [
        f"# A/B report {meta.get('started', '')}",
        "",
        f"Locust {meta.get('locust_version', '?')}, {meta.get('users')} users "
        f"(weights {meta.get('weights')}), spawn rate {meta.get('spawn_rate')}/s, "
        f"{meta.get('duration_s')} s, through HAProxy {meta.get('host')} "
        f"(balance {meta.get('balance', '?')}). Machine: {meta.get('cpu', {}).get('cores')} cores; "
        f"CPU used by processes outside the stack and Locust during the run: "
        f"{_fmt(meta.get('cpu', {}).get('foreign_percent'))}% of the machine."
        + (f" The users ran on {meta['remote_workers']} Locust worker"
           f"{'s' if meta['remote_workers'] != 1 else ''} on other hosts (their CPU is "
           "not counted here; this host ran the master only)." if meta.get("remote_workers") else ""),
        "",
        f"Total: {_fmt(totals['requests'])} requests, {_fmt(totals['failures'])} failures, "
        f"{_fmt(totals['rps'])} req/s; HAProxy sessions: {_fmt(totals['haproxy_sessions'])}.",
        "",
        "## Per server and path",
        "",
        "Latency is measured by Locust and grouped by the `X-Served-By` header HAProxy adds. "
        "The share of a path is the fraction of that path's requests the server finished; "
        "the server's overall share is its part of HAProxy's sessions (`stot`).",
        "",
        summary_table(report),
        "",
    ]
    for key, per_path in report["ratios"].items():
        out += [f"## Ratios {key}", "", "| path | requests | p50 | p99 |", "|---|---:|---:|---:|"]
        for path, r in per_path.items():
            out.append(f"| {path} | {_fmt(r['requests'], 2)} | {_fmt(r['p50_ms'], 2)} | {_fmt(r['p99_ms'], 2)} |")
        out.append("")
    out += ["## All servers, per path", "",
            "| path | requests | failures | req/s | p50 ms | p95 ms | p99 ms | max ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for path, p in report["paths"].items():
        out.append(
            f"| {path} | {_fmt(p['requests'])} | {_fmt(p['failures'])} | {_fmt(p['rps'])} | "
            f"{_fmt(p['p50_ms'], 0)} | {_fmt(p['p95_ms'], 0)} | {_fmt(p['p99_ms'], 0)} | {_fmt(p['max_ms'], 0)} |"
        )
    out += ["", "## HAProxy counters (delta over the run)", "",
            "| server | status | sessions | 2xx | 4xx | 5xx | conn. errors | retries | redispatches | MiB out |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, srv in report["servers"].items():
        h = srv["haproxy"]
        if not h:
            continue
        out.append(
            f"| {name} | {h.get('status')} | {_fmt(h['stot'])} | {_fmt(h['hrsp_2xx'])} | {_fmt(h['hrsp_4xx'])} | "
            f"{_fmt(h['hrsp_5xx'])} | {_fmt(h['econ'])} | {_fmt(h['wretr'])} | {_fmt(h['wredis'])} | "
            f"{_fmt(h['bout'] / 2**20)} |"
        )
    out += ["", f"![A/B plot]({plot_name})", ""]
    return "\n".join(out)


def plot(report, path):
    """Write a 2x2 PNG: share, req/s, p50/p99 latency and failures per path and server."""
    import matplotlib.ticker
    import numpy as np

    names = [n for n in report["servers"] if report["servers"][n]["paths"]]
    paths = [p for p in PATHS if any(p in report["servers"][n]["paths"] for n in names)]
    x = np.arange(len(paths))
    width = 0.8 / max(len(names), 1)
    fig, axes = new_figure(2, 2, figsize=(12, 8))

    def values(name, key, scale=1.0):
        return [report["servers"][name]["paths"].get(p, {}).get(key, 0) * scale for p in paths]

    panels = [
        (axes[0][0], "share", 100.0, "share of the path's requests (%)", False),
        (axes[0][1], "rps", 1.0, "requests/s", True),
        (axes[1][0], "p50_ms", 1.0, "latency p50 (solid) / p99 (hatched), ms", True),
        (axes[1][1], "failures", 1.0, "failed requests", False),
    ]
    for ax, key, scale, label, log in panels:
        for i, name in enumerate(names):
            kind = report["servers"][name]["wsgi_server"]
            color = f"C{i}"  # one colour per server in every panel
            ax.bar(x + i * width, values(name, key, scale), width, color=color, label=f"{name} ({kind})")
            if key == "p50_ms":
                ax.bar(x + i * width, values(name, "p99_ms"), width, fill=False, hatch="//",
                       edgecolor=color)
        ax.set_xticks(x + width * (len(names) - 1) / 2, paths)
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
            # plain numbers (20, 50, 200) instead of powers of ten on every tick
            plain = matplotlib.ticker.FuncFormatter(lambda value, _pos: f"{value:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        if key == "share":
            ax.axhline(50, color="grey", linewidth=0.8, linestyle=":")
        if key == "failures":
            # A run without failures should show a clean zero, not a negative axis.
            top = max([1] + [v for n in names for v in values(n, key)])
            ax.set_ylim(0, top * 1.2)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(loc="lower right")
    meta = report["meta"]
    fig.suptitle(
        f"A/B through HAProxy ({meta.get('balance', '?')}): {meta.get('users')} users, "
        f"{meta.get('duration_s')} s, {meta.get('started', '')}"
    )
    save_figure(fig, path)


def write(report, directory):
    """Write report.json, report.md and ab.png into ``directory``; return their paths."""
    # the JSON keeps the order of the report's keys: the servers in stack order
    return write_report(directory, report, to_markdown(report, "ab.png"),
                        [("ab.png", lambda path: plot(report, path))])
