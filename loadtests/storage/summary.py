"""The storage benchmark's summary: cells over rounds, ratios to ZEO, report.md
(``to_markdown``) and the plot.
"""
import numpy as np

from loadtests.core.reports import markdown_table, new_figure, save_figure, spread_bars
from loadtests.core.stats import format_spread, spread
from loadtests.storage import conflicts
from loadtests.storage.plan import BASELINE, WRITE


# ----------------------------------------------------------------------------- summary and report

def cell_key(variant, label, connections):
    return f"{variant} {label} {connections}"


def summarize(runs, variants):
    """``(cells, ratios)`` from the run rows.

    ``cells``: ``{"<variant> <path> <connections>": {"rps": spread, "p50_ms", "p99_ms",
    "client_cpu_ms", "database_cpu_ms" (medians over the rounds), "errors" (sum), "runs"}}``.
    ``ratios``: ``{"<variant>/zeo <path> <connections>": spread}`` of the per-round ratios
    of req/s, for every variant but zeo; a round counts when both ran in it and zeo's
    req/s is above 0."""
    by = {}
    for r in runs:
        by.setdefault((r["variant"], r["path"], r["connections"]), {})[r["round"]] = r

    def median(rows, field):
        values = [r[field] for r in rows if r[field] is not None]
        return round(float(np.median(values)), 2) if values else None

    cells = {}
    for (variant, label, n), per_round in by.items():
        rows = list(per_round.values())
        cells[cell_key(variant, label, n)] = {
            "rps": spread([r["rps"] for r in rows]),
            **{field: median(rows, field) for field in ("p50_ms", "p99_ms", "client_cpu_ms", "database_cpu_ms")},
            "errors": sum(r["errors"] for r in rows), "runs": len(rows)}
    ratios = {}
    for (variant, label, n), per_round in by.items():
        baseline = by.get((BASELINE, label, n), {})
        if variant == BASELINE:
            continue
        values = [per_round[k]["rps"] / baseline[k]["rps"] for k in per_round
                  if k in baseline and baseline[k]["rps"] > 0]
        if values:
            ratios[f"{variant}/{BASELINE} {label} {n}"] = spread(values)
    order = {v: i for i, v in enumerate(variants)}
    ratios = dict(sorted(ratios.items(), key=lambda kv: (order.get(kv[0].split("/")[0], 99), kv[0])))
    return cells, ratios


def reads_within(ratios, fraction=0.9):
    """``{variant: bool}``: every read path's median ratio at least ``fraction`` (issue 14's
    goal: reads within 10 % of ZEO); variants without read ratios are left out."""
    verdict = {}
    for name, value in ratios.items():
        variant, label = name.split("/")[0], name.split(" ")[1]
        if label != WRITE:
            verdict[variant] = verdict.get(variant, True) and value["median"] >= fraction
    return verdict


def _or_dash(value):
    return "-" if value is None else value


def _mib(n):
    return f"{n / 2**20:,.1f}"


def to_markdown(meta, cells, ratios, sizes, found=None):
    """report.md: settings, req/s per path/connections/variant, ratios, latencies and CPU,
    database sizes, and per variant the conflict report of its client's log (``found``:
    ``{variant: loadtests.storage.conflicts.read(...)}``)."""
    variants, labels, counts = meta["variants"], meta["paths"], meta["connections"]
    groups = [(label, n) for label in labels for n in counts]

    def cell(variant, label, n):
        return cells.get(cell_key(variant, label, n), {})

    others = [v for v in variants if v != BASELINE]
    within = reads_within(ratios)
    lines = [
        f"# ZEO vs RelStorage, {meta['started']}",
        "",
        f"`{meta['command']}`: {meta['rounds']} round(s), each run {meta['warmup_s']} s warm-up + "
        f"{meta['duration_s']} s measured (wrk, directly against the one `instance` client on "
        f"{meta['server']}, 2 workers; the writes through HAProxy's write lane, one at a time), the orders "
        f"rotated per round; {meta['cores']} cores, load average "
        f"{meta['load_before']} before, {meta['load_during']} in the middle, {meta['load_after']} after; "
        f"{meta['minutes']} min.",
        "",
        "Requests/s, median over the rounds (min–max):",
        "",
        markdown_table(["path", "conns"] + variants,
                       [[label, n] + [format_spread(cell(v, label, n).get("rps"), 1) for v in variants]
                        for label, n in groups]),
        "",
        "Ratio of req/s to zeo in the same round, median (min–max); below 1: slower than ZEO:",
        "",
        markdown_table(["path", "conns"] + [f"{v}/zeo" for v in others],
                       [[label, n] + [format_spread(ratios.get(f"{v}/{BASELINE} {label} {n}"), 2) for v in others]
                        for label, n in groups]),
        "",
        "Reads within 10 % of ZEO (every read path's median ratio >= 0.90): "
        + ", ".join(f"{v} {'yes' if ok else 'no'}" for v, ok in within.items()) + ".",
        "",
        "p50 / p99 latency in ms; CPU ms per request of the client / the database (process "
        "trees); medians over the rounds; errors summed:",
        "",
        markdown_table(["path", "conns"] + variants, [[label, n] + [
            "-" if not cell(v, label, n) else
            f"{cell(v, label, n)['p50_ms']} / {cell(v, label, n)['p99_ms']} ms; "
            f"cpu {_or_dash(cell(v, label, n)['client_cpu_ms'])} / {_or_dash(cell(v, label, n)['database_cpu_ms'])}"
            + (f"; {cell(v, label, n)['errors']} errors" if cell(v, label, n)["errors"] else "")
            for v in variants] for label, n in groups]),
        "",
        "After the run (every variant started empty):",
        "",
        markdown_table(["variant", "documents written", "data MiB", "blobs MiB", "total MiB", "what",
                        "first blob download s"],
                       [[v, sizes[v].get("documents"), _mib(sizes[v]["data_bytes"]), _mib(sizes[v]["blob_bytes"]),
                         _mib(sizes[v]["total_bytes"]), sizes[v]["what"], meta["setup"][v].get("first_blob_s")]
                        for v in variants if "data_bytes" in sizes.get(v, {})]),
        "",
        "![req/s per path, connections and variant](storage.png)",
        "",
    ]
    for variant, report in (found or {}).items():
        lines += [f"Conflicts on {variant} (`python -m loadtests conflicts {variant}/var/log/instance.log"
                  + (f" --server-log {variant}/var/log/zeoserver.log" if report.get("server") is not None else "")
                  + "` in the work directory; the whole run, warm-ups included):", "",
                  conflicts.to_markdown(report, limit=10), ""]
        if report.get("write_answers"):
            lines += [f"POSTs of the write path in {variant}/var/log/instance-access.log by status (every one, "
                      f"warm-ups and POSTs queued when a run ended included): "
                      + ", ".join(f"{status}: {n}" for status, n in report["write_answers"].items()), ""]
    return "\n".join(lines)


def plot(cells, meta, path):
    """One panel per connection count: bars of req/s (log scale) per path and variant,
    min–max whiskers."""
    variants, labels, counts = meta["variants"], meta["paths"], meta["connections"]
    fig, axes = new_figure(1, len(counts), figsize=(4.5 * len(counts), 4.2))
    axes = np.atleast_1d(axes)
    for ax, n in zip(axes, counts):
        spread_bars(ax, labels, [(v, {label: cells.get(cell_key(v, label, n), {}).get("rps") for label in labels})
                                 for v in variants], capsize=2)
        ax.set_yscale("log")
        ax.set_title(f"{n} connection{'s' if n > 1 else ''}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("requests/s (median, min-max; log)")
    axes[0].legend(fontsize="small")
    save_figure(fig, path)
