"""The report of a rounds invocation, from the dict of :func:`loadtests.ab.abstats.rounds_report`
(the statistics and verdicts): ``report.md`` (``rounds_markdown``, with a ``table`` per kind),
``ab.png`` (``plot``) and the files (``write_rounds_report``).
"""
import numpy as np

from loadtests.ab.abstats import PATHS
from loadtests.core.reports import markdown_table, new_figure, save_figure, write_report


def write_rounds_report(data, directory):
    """Write ``report.json``, ``report.md`` and ``ab.png`` of a rounds invocation; return the
    paths of the last two."""
    meta = data["meta"]
    summaries = {f"A/B: A = {meta['name_a']}, B = {meta['name_b']}": data["stats"]["ab"]}
    if data["stats"]["aa"]:
        summaries[f"A/A control: both {meta['control_server']}"] = data["stats"]["aa"]
    title = (f"A/B in {meta['rounds']} rounds x {meta['duration_s']} s, {meta['users']} users, "
             f"{meta['started']}")
    _, md_path, png_path = write_report(directory, data, rounds_markdown(data), [
        ("ab.png", lambda path: plot(summaries, path, title))])
    return md_path, png_path


def rounds_markdown(data):
    """report.md of a rounds invocation (``data`` as built by ``rounds_report``), a str."""
    meta = data["meta"]
    slot = data["slot_share"]
    lines = [
        f"# A/B report {meta['started']}",
        "",
        f"{meta['rounds']} rounds, {meta['runs']} runs of {meta['warmup_s']:g} s warm-up (left out of every "
        f"figure) + {meta['duration_s']} s measured, cut into {meta['window_s']:g} s windows; "
        f"{meta['users']} Locust {meta['locust_version']} users (weights {meta['weights']}), HAProxy "
        f"{meta['balance']} through a temporary HAProxy in front of two slots: a (:{meta['slot_ports']['a']}, "
        f"first in the server list) and b (:{meta['slot_ports']['b']}). A = {meta['name_a']}, "
        f"B = {meta['name_b']}; A sits in slot a in odd rounds and in slot b in even ones. "
        f"Machine: {meta['cores']} cores, load average at the start {meta['load_average_start'][0]:.2f}. "
        + budget_sentence(meta),
        "",
        "## Verdict",
        "",
    ]
    lines += [f"- {v['text']}" for v in data["verdicts"]]
    if slot:
        lines += ["", f"Position check: slot a (first in HAProxy's list) finished {100 * slot['value']:.1f}% "
                  f"(95% CI {100 * slot['low']:.1f}–{100 * slot['high']:.1f}%) of the A/B requests."]
    if data["warnings"]:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in data["warnings"]]
    lines += ["", "## A/B: share, req/s and latency ratios (95% bootstrap intervals over rounds x windows)", "",
              table(data["stats"]["ab"]), ""]
    if data["stats"]["aa"]:
        lines += [f"## A/A control (both slots on {meta['control_server']}): the noise floor", "",
                  table(data["stats"]["aa"]), ""]
    lines += ["## The servers' own time (HAProxy's log)", "",
              "From the temporary HAProxy's log of each run, after the warm-up: the share column "
              "counts HAProxy's requests (a check of Locust's); the p50/p99 ratios are of `Tr`, the "
              "time from sending the request to the server until its response headers arrived: "
              "without the wait in HAProxy's queue and without the body's transfer to Locust, "
              "which set the pace of the share on this machine "
              "(docs/explanation/ab-method.md#sensitivity-a-known-difference). HAProxy logs the URL only, "
              "so /Plone as page and as JSON are one row.", "",
              "A/B:", "", table(data["server_time"]["ab"]), ""]
    if data["server_time"]["aa"]:
        lines += ["A/A:", "", table(data["server_time"]["aa"]), ""]
    lines += ["## Runs", "", markdown_table(
        ["run", "slot a", "slot b", "requests", "failures", "req/s", "warm-up requests left out",
         "Locust cores", "machine busy %", "foreign %", "slot a CPU", "slot b CPU", "report"],
        [[f"{run['kind']} r{run['round']}", run["slots"]["a"], run["slots"]["b"], run["totals"]["requests"],
          run["totals"]["failures"], round(run["totals"]["rps"], 1), sum(run["warmup_requests"].values()),
          run["cpu"]["load_generator_cores"], run["cpu"]["machine_busy_percent"], run["cpu"]["foreign_percent"],
          *(slot_cpu_cell((run.get("slot_cpu") or {}).get(slot)) for slot in ("a", "b")),
          f"[{run['directory']}]({run['directory']}/report.md)"] for run in data["runs"]])]
    lines += ["", "![A/B with intervals](ab.png)", ""]
    return "\n".join(lines)


def budget_sentence(meta):
    """The report's sentence on the CPU budgets (``loadtests.ab.budget``) of ``meta``."""
    if meta.get("cpu_budget") != "equal":
        return ("No CPU budgets (`--cpu-budget off`): the slots' clients share the machine with Locust and "
                "HAProxy, and the share shows how a saturated machine is shared, too.")
    cut = meta.get("calibrate_percent")
    return (f"CPU budgets: each slot's client in a cgroup v1 `cpu` group with a quota of {meta['slot_cpus']:g} "
            "cores, Locust and HAProxy outside" + (f"; in the calibration's A/B runs A's quota is {cut:g}% lower"
                                                    if cut is not None else "")
            + ". The slot CPU columns below give cores used / quota and the share of CFS periods in which "
            "the slot used its whole quota (throttled): a slot at its budget is near its quota and near 100%.")


def slot_cpu_cell(usage):
    """``used/quota cores (throttled %)`` of one slot in one run, "-" without budgets."""
    if not usage:
        return "-"
    throttled = "" if usage["throttled"] is None else f" ({100 * usage['throttled']:.0f}%)"
    used = "-" if usage["used_cores"] is None else f"{usage['used_cores']:.2f}"
    return f"{used}/{usage['cores']:.2f}{throttled}"


def _ci(entry, scale=100.0, digits=1, unit="%"):
    if not entry:
        return "-"
    return (f"{scale * entry['value']:.{digits}f}{unit} "
            f"({scale * entry['low']:.{digits}f}–{scale * entry['high']:.{digits}f})")


def table(summary):
    """Markdown table of one kind's :func:`loadtests.ab.abstats.summarize` result."""
    lines = ["| path | share of A (95% CI) | req/s ratio A/B | p50 ratio A/B | p99 ratio A/B | windows |",
             "|---|---:|---:|---:|---:|---:|"]
    for path, s in summary.items():
        lines.append(f"| {path} | {_ci(s['share'])} | {_ci(s['rps_ratio'], 1, 2, '')} | "
                     f"{_ci(s['p50_ratio'], 1, 2, '')} | {_ci(s['p99_ratio'], 1, 2, '')} | {s['share']['n']} |")
    return "\n".join(lines)


def plot(summaries, path, title):
    """PNG with the share, req/s ratio and p50/p99 ratios per path, each with its 95 % interval.

    ``summaries``: ``{label: summarize() result}`` (e.g. A/B and A/A), one colour each.
    """

    panels = [("share", 100.0, "share of A (%)", 50.0), ("rps_ratio", 1.0, "req/s ratio A/B", 1.0),
              ("p50_ratio", 1.0, "p50 ratio A/B", 1.0), ("p99_ratio", 1.0, "p99 ratio A/B", 1.0)]
    fig, axes = new_figure(2, 2, figsize=(12, 8))
    paths = [p for p in PATHS if any(p in s for s in summaries.values())]
    x = np.arange(len(paths))
    width = 0.8 / max(len(summaries), 1)
    for ax, (key, scale, label, neutral) in zip(axes.flat, panels):
        for i, (name, summary) in enumerate(summaries.items()):
            entries = [summary.get(p, {}).get(key) for p in paths]
            value = np.array([scale * e["value"] if e else np.nan for e in entries])
            low = np.array([scale * e["low"] if e else np.nan for e in entries])
            high = np.array([scale * e["high"] if e else np.nan for e in entries])
            ax.errorbar(x + i * width, value, yerr=[value - low, high - value], fmt="o", capsize=4,
                        color=f"C{i}", label=name)
        ax.axhline(neutral, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xticks(x + width * (len(summaries) - 1) / 2, paths)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(loc="best")
    fig.suptitle(title + " (bars: 95% bootstrap intervals)")
    save_figure(fig, path)
