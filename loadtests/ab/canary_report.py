"""The canary judge's report: ``report.json``, ``report.md`` and ``canary.png`` from the dict of
:func:`loadtests.ab.canary.judge` (ratios canary / comparison, error excesses as fractions,
times in epoch seconds, shown in local time as HAProxy logs them)."""
from datetime import datetime

import numpy as np

from loadtests.ab.canary import CANARY, CLASSES, COMPARISON, PHASE_NAMES, PHASES
from loadtests.core.reports import markdown_table, new_figure, save_figure, write_report


def _when(epoch, open_end):
    return open_end if epoch is None else datetime.fromtimestamp(epoch).isoformat(sep=" ", timespec="seconds")


def _ratio(entry):
    if not entry:
        return "-"
    return f"{entry['value']:.2f} ({entry['low']:.2f}–{entry['high']:.2f})"


def _points(entry):
    if not entry:
        return "-"
    return f"{100 * entry['value']:+.2f} ({100 * entry['low']:+.2f}–{100 * entry['high']:+.2f})"


def _limit(value, fmt):
    return "-" if value is None else fmt(value)


def markdown(data):
    """The report as Markdown: the verdict and its reasons, what was judged, one row per class."""
    settings = data["settings"]
    lines = [f"# Canary {settings['canary']}: {data['verdict']}", ""]
    lines += [f"- {reason}" for reason in data["reasons"]]
    lines += [f"- warning: {warning}" for warning in data["warnings"]]
    phases = settings["phases"]
    lines += ["", f"Judged {data['judged_requests']:,} requests that HAProxy logged for the canary "
              f"`{settings['canary']}` and its comparison clients `{'`, `'.join(settings['compare'])}` "
              "(requests varnish answered, or HAProxy refused, never reach them and are not here). "
              f"A/A phase (the canary on the old release, the noise floor): "
              f"{_when(phases['aa']['from'], 'the first line')} to {_when(phases['aa']['until'], '')}; "
              f"A/B phase (the new release): {_when(phases['ab']['from'], '')} to "
              f"{_when(phases['ab']['until'], 'the last line')} (local time).",
              "",
              f"Limits: Tr p50 and p99 ratios canary / comparison up to the A/A interval's upper end × (1 + "
              f"{100 * settings['max_slowdown']:g}%); error-rate excess up to the A/A interval's upper end (at "
              f"least 0) + {100 * settings['max_error_increase']:g} points; at least {settings['min_requests']:,} "
              f"requests per class, side and phase, and {settings['min_windows']} windows of "
              f"{settings['window_s']:g} s in which both sides answered the class. Ratios and excesses with "
              "their 95% bootstrap interval (loadtests.ab.abstats; docs/explanation/canary.md).", ""]
    rows = []
    for cls, entry in data["classes"].items():
        stats, limits = entry["stats"], entry["limits"]
        requests = {phase: "{:,} / {:,}".format(*(stats[phase]["counts"][side]["requests"]
                                                  for side in (CANARY, COMPARISON))) for phase in PHASES}
        errors = "{:,} / {:,}".format(*(stats["ab"]["counts"][side]["errors"] for side in (CANARY, COMPARISON)))
        rows.append([cls, entry["verdict"], requests["aa"], requests["ab"], errors,
                     _ratio(stats["aa"]["p50_ratio"]), _ratio(stats["ab"]["p50_ratio"]),
                     _limit(limits["p50_ratio"], "{:.2f}".format),
                     _ratio(stats["aa"]["p99_ratio"]), _ratio(stats["ab"]["p99_ratio"]),
                     _limit(limits["p99_ratio"], "{:.2f}".format),
                     _points(stats["ab"]["error_excess"]),
                     _limit(limits["error_excess"], lambda v: f"{100 * v:+.2f}")])
    lines.append(markdown_table(
        ["class", "verdict", "requests A/A canary / comparison", "requests A/B canary / comparison",
         "errors A/B canary / comparison", "Tr p50 ratio A/A", "Tr p50 ratio A/B", "p50 limit",
         "Tr p99 ratio A/A", "Tr p99 ratio A/B", "p99 limit", "error excess A/B (points)", "error limit"], rows))
    servers = sorted({server for phase in PHASES for server in data["servers"][phase]})
    lines += ["", "Requests per server:", "", markdown_table(
        ["server", "role", *(PHASE_NAMES[phase] for phase in PHASES)],
        [[server, "canary" if server == settings["canary"] else "comparison",
          *(data["servers"][phase].get(server, 0) for phase in PHASES)] for server in servers])]
    if data["left_out"]:
        lines += ["", "Lines left out: " + ", ".join(f"{reason} {n:,}" for reason, n in data["left_out"].items())
                  + "."]
    lines += ["", "![Tr ratios canary / comparison per class](canary.png)", ""]
    return "\n".join(lines)


def plot(data, path):
    """PNG: the Tr p50 and p99 ratios canary / comparison per class, A/A and A/B with their
    95 % intervals, and each class's limit (a red bar)."""
    fig, axes = new_figure(1, 2, figsize=(11, 4))
    classes = [cls for cls in CLASSES if cls in data["classes"]]
    x = np.arange(len(classes))
    for ax, (measure, label) in zip(axes, (("p50_ratio", "Tr p50 ratio canary / comparison"),
                                           ("p99_ratio", "Tr p99 ratio canary / comparison"))):
        for i, phase in enumerate(PHASES):
            entries = [data["classes"][cls]["stats"][phase][measure] for cls in classes]
            value = np.array([e["value"] if e else np.nan for e in entries])
            low = np.array([e["low"] if e else np.nan for e in entries])
            high = np.array([e["high"] if e else np.nan for e in entries])
            ax.errorbar(x + (i - 0.5) * 0.3, value, yerr=[value - low, high - value], fmt="o", capsize=4,
                        color=f"C{i}", label=PHASE_NAMES[phase])
        limits = [data["classes"][cls]["limits"][measure] for cls in classes]
        ax.scatter(x, [np.nan if v is None else v for v in limits], marker="_", s=600, color="red",
                   label="limit")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xticks(x, classes)
        ax.set_xlim(-0.6, len(classes) - 0.4)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="best")
    fig.suptitle(f"canary {data['settings']['canary']}: {data['verdict']} (bars: 95% bootstrap intervals)")
    save_figure(fig, path)


def write(folder, data):
    """Write ``report.json``, ``report.md`` and ``canary.png`` of ``data`` into ``folder``;
    returns their paths."""
    return write_report(folder, data, markdown(data), [("canary.png", lambda path: plot(data, path))])
