"""Per-mode A/B report: ``report.json``, ``report.md`` and ``modes.png`` over balance modes.

Input: ``runs``, one dict per Locust run (a mode in one round), each with ``mode``,
``round`` (1-based), ``directory`` (the run's folder, relative to the report), ``report``
(that run's ``loadtests.ab.report.build`` dict, computed from the run's own temporary
HAProxy's stats), ``per_server`` (the locustfile's per-server JSON, for its
response-time histograms), ``balancer_pid`` and ``queue`` (``{"logged", "queued"}`` from
``loadtests.core.haproxy_log.queue_waits`` on that HAProxy's log).

Per mode and server, over all rounds of that mode: ``requests`` and ``failures`` (Locust,
grouped by ``X-Served-By``), ``haproxy_sessions`` (``stot`` delta of that mode's HAProxy),
``share`` (of those sessions, 0..1), ``rps`` (Locust requests / summed Locust elapsed
seconds) and ``p50_ms``/``p95_ms``/``p99_ms`` (from the merged Locust histograms, all
paths). ``queued_share`` (0..1) is the fraction of the logged requests that waited in
HAProxy's queue for a free ``maxconn`` slot: those went to whichever server freed a slot
first, whatever the balance mode. ``foreign_percent`` is the CPU the machine spent on other processes during the
mode's runs, in percent of all cores.
"""

from loadtests.ab.report import _fmt, _pct, latency
from loadtests.core.reports import markdown_table, new_figure, save_figure, write_report
from loadtests.core.stats import merge_histograms


def _ratio(a, b):
    return a / b if b else None


def build(meta, runs, server_kinds):
    """Return ``{"meta", "modes": {mode: {"servers", "totals", "rounds"}}}`` in mode order."""
    modes = {}
    for mode in meta["modes"]:
        mine = [r for r in runs if r["mode"] == mode]
        elapsed = sum(r["per_server"].get("elapsed_s", 0.0) for r in mine)
        sessions = sum(r["report"]["totals"]["haproxy_sessions"] for r in mine)
        servers = {}
        for name, kind in server_kinds.items():
            per_run = [r["report"]["servers"].get(name, {}) for r in mine]
            requests = sum(s.get("requests", 0) for s in per_run)
            stot = sum(s.get("haproxy", {}).get("stot", 0) for s in per_run)
            histogram = merge_histograms(
                r["per_server"].get("server_totals", {}).get(name, {}).get("response_times", {}) for r in mine)
            servers[name] = {
                "wsgi_server": kind,
                "requests": requests,
                "failures": sum(s.get("failures", 0) for s in per_run),
                "haproxy_sessions": stot,
                "share": _ratio(stot, sessions),
                "rps": _ratio(requests, elapsed),
                **latency(histogram),
            }
        wall = sum(r["report"]["meta"]["wall_s"] for r in mine)
        foreign = sum(r["report"]["meta"]["cpu"]["foreign_cpu_s"] for r in mine)
        cores = meta.get("cores") or 1
        modes[mode] = {
            "servers": servers,
            "totals": {
                "requests": sum(r["report"]["totals"]["requests"] for r in mine),
                "failures": sum(r["report"]["totals"]["failures"] for r in mine),
                "haproxy_sessions": sessions,
                "rps": _ratio(sum(r["report"]["totals"]["requests"] for r in mine), elapsed),
                "elapsed_s": round(elapsed, 1),
                "foreign_percent": round(100.0 * foreign / (wall * cores), 1) if wall else None,
                "queued_share": _ratio(sum(r["queue"]["queued"] for r in mine),
                                       sum(r["queue"]["logged"] for r in mine)),
            },
            "rounds": [{
                "round": r["round"],
                "directory": r["directory"],
                "balancer_pid": r["balancer_pid"],
                "requests": r["report"]["totals"]["requests"],
                "haproxy_sessions": r["report"]["totals"]["haproxy_sessions"],
                "rps": r["report"]["totals"]["rps"],
                "share": {n: s["share"] for n, s in r["report"]["servers"].items() if n in server_kinds},
                "foreign_percent": r["report"]["meta"]["cpu"]["foreign_percent"],
                "queued_share": _ratio(r["queue"]["queued"], r["queue"]["logged"]),
            } for r in mine],
        }
    return {"meta": meta, "modes": modes}


def summary_table(report):
    """Markdown table: one row per mode and server, and a total row per mode (with the
    CPU share other processes on the machine used meanwhile, in percent of all cores)."""
    rows = []
    for mode, data in report["modes"].items():
        rows += [[mode, name, s["wsgi_server"], _fmt(s["requests"]), _pct(s["share"]), _fmt(s["rps"]),
                  _fmt(s["p50_ms"]), _fmt(s["p95_ms"]), _fmt(s["p99_ms"]), _fmt(s["failures"]), ""]
                 for name, s in data["servers"].items()]
        t = data["totals"]
        rows.append([f"**{mode}**", "all", "", _fmt(t["requests"]),
                     f"{_fmt(t['haproxy_sessions'])} HAProxy sessions, {_pct(t['queued_share'])} queued",
                     _fmt(t["rps"]), "", "", "", _fmt(t["failures"]), f"{_fmt(t['foreign_percent'])}%"])
    return markdown_table(["mode", "server", "WSGI server", "requests", "share", "req/s", "p50 ms", "p95 ms",
                           "p99 ms", "failures", "foreign CPU"], rows)


def to_markdown(report, plot_name="modes.png"):
    """The whole ``report.md`` text."""
    meta = report["meta"]
    out = [
        f"# A/B report per balance mode, {meta['started']}",
        "",
        f"- modes: {', '.join(meta['modes'])} (deployed HAProxy: {meta.get('deployed_balance')}); "
        f"{meta['rounds']} round(s), modes interleaved in each round",
        f"- per mode and round: {meta['duration_s']} s of Locust, {meta['users']} users "
        f"(spawn rate {meta['spawn_rate']}/s), weights {meta['weights']}",
        "- each mode ran through its own temporary HAProxy (the deployed config with only "
        f"`balance` and the ports changed; frontend {meta['balancer_url']}) in front of the "
        "same two running ZEO clients",
        f"- Locust {meta['locust_version']}, {meta['cores']} cores",
        "",
        "Share = fraction of that mode's HAProxy sessions (`stot`) each server took; req/s and "
        "latency (ms, all paths) from Locust, grouped by `X-Served-By`.",
        "",
        summary_table(report),
        "",
        "## Runs",
        "",
        "| mode | round | requests | HAProxy sessions | queued | req/s | share | foreign CPU | report |",
        "|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for mode, data in report["modes"].items():
        for r in data["rounds"]:
            shares = ", ".join(f"{n} {_pct(v)}" for n, v in r["share"].items())
            out.append(
                f"| {mode} | {r['round']} | {_fmt(r['requests'])} | {_fmt(r['haproxy_sessions'])} | "
                f"{_pct(r['queued_share'])} | {_fmt(r['rps'])} | {shares} | {_fmt(r['foreign_percent'])}% | "
                f"[{r['directory']}/report.md]({r['directory']}/report.md) |"
            )
    out += ["", "Queued: requests that waited in HAProxy's queue for a free `maxconn` slot (from "
            "that HAProxy's log); HAProxy gives a queued request to whichever server frees a slot "
            "first, so the balance mode decides only for the others. Foreign CPU: what other "
            "processes on this shared machine used during the run, in percent of all cores.", "",
            f"![per-mode plot]({plot_name})", ""]
    return "\n".join(out)


def plot(report, path):
    """Write a 1x3 PNG: share, req/s and p50 (solid) / p99 (hatched) latency per mode and server."""
    import numpy as np

    modes = list(report["modes"])
    names = list(next(iter(report["modes"].values()))["servers"]) if modes else []
    x = np.arange(len(modes))
    width = 0.8 / max(len(names), 1)
    fig, axes = new_figure(1, 3, figsize=(15, 4.8))

    def values(name, key, scale=1.0):
        return [(report["modes"][m]["servers"][name].get(key) or 0) * scale for m in modes]

    for ax, key, scale, label in ((axes[0], "share", 100.0, "share of HAProxy sessions (%)"),
                                  (axes[1], "rps", 1.0, "requests/s"),
                                  (axes[2], "p99_ms", 1.0, "latency p50 (solid) / p99 (hatched), ms")):
        for i, name in enumerate(names):
            kind = report["modes"][modes[0]]["servers"][name]["wsgi_server"]
            color = f"C{i}"  # one colour per server in every panel
            if key == "p99_ms":
                ax.bar(x + i * width, values(name, "p50_ms"), width, color=color, label=f"{name} ({kind})")
                ax.bar(x + i * width, values(name, key), width, fill=False, hatch="//", edgecolor=color)
            else:
                ax.bar(x + i * width, values(name, key, scale), width, color=color, label=f"{name} ({kind})")
        ax.set_xticks(x + width * (len(names) - 1) / 2, modes)
        ax.set_ylabel(label)
        if key == "share":
            ax.axhline(50, color="grey", linewidth=0.8, linestyle=":")
            ax.set_ylim(0, 115)  # room for the legend above the bars
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="upper center", ncol=2)
    meta = report["meta"]
    fig.suptitle(f"A/B per balance mode: {meta['users']} users, {meta['duration_s']} s x "
                 f"{meta['rounds']} round(s) per mode, {meta['started']}")
    save_figure(fig, path)


def write(report, directory):
    """Write report.json, report.md and modes.png into ``directory``; return their paths."""
    # the JSON keeps the order of the report's keys: modes and servers in run order
    return write_report(directory, report, to_markdown(report, "modes.png"),
                        [("modes.png", lambda path: plot(report, path))])
