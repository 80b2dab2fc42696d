"""Confidence intervals and verdicts of an A/B run in rounds (``loadtests.ab.abtest``).

Input: the runs of one ``abtest`` invocation, each ``{"kind": "ab" | "aa", "round": n,
"labels": {"A": HAProxy server name, "B": ...}, "windows": [...]}`` where ``windows`` is the
locustfile's ``--per-server-stats`` ``windows`` list (time windows after the warm-up).
``A`` is the slot running the first server of ``abslots.SERVERS`` (pyruvate) in an A/B
run; in an A/A run (both slots on one server) ``A`` is the slot pyruvate would hold in
that round, so the A/A split is the same statistic with no server difference: the noise
floor.

Every time window of every run of a kind is one resampling unit (counts of A and B, and
their p50/p99 in that window, paired). ``scipy.stats.bootstrap`` (percentile method,
``N_RESAMPLES`` resamples, fixed seed so a report can be re-made identically) gives the
95 % interval of:

- ``share``: A's requests / (A's + B's), a fraction 0..1;
- ``rps_ratio``: A's requests / B's requests over the same windows (= req/s ratio);
- ``p50_ratio``, ``p99_ratio``: mean over windows of A's p50 (p99) / the same of B's.

Windows next to each other are not fully independent (a slow request spans a boundary),
so the intervals are somewhat narrow; the A/A floor measured the same way absorbs part of
that.

The statistics stage of the A/B: :func:`rounds_report` turns the runs (plain dicts) into
the report dict (statistics, verdicts, warnings) that ``loadtests.ab.rounds_report``
renders, from the runs' Locust windows and their ``server_time_windows``
(:func:`loadtests.core.haproxy_log.server_time_windows`).
"""
import numpy as np

from scipy import stats

from loadtests.core.haproxy_log import LOG_PATHS
from loadtests.loggedin import LOGGED_IN

#: Request names of the locustfile, its logged-in shape's path class (the locustfile's
#: windows hold its requests together under that name), and "all" (every path of a window
#: together).
PATHS = ("/", "/Plone", "@json", "blob 5MB", LOGGED_IN, "all")
#: Paths of opt-in shapes: a verdict only when the run had them.
OPT_IN_PATHS = (LOGGED_IN,)
N_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20261123


def _samples(runs, kind, path):
    """Arrays (shape ``(windows,)``) of A's and B's count, p50 and p99 in ``path``."""
    rows = []
    for run in runs:
        if run["kind"] != kind:
            continue
        for window in run["windows"]:
            a = window["servers"].get(run["labels"]["A"], {}).get(path)
            b = window["servers"].get(run["labels"]["B"], {}).get(path)
            na, nb = (a or {}).get("n", 0), (b or {}).get("n", 0)
            if na + nb == 0:
                continue
            rows.append((na, nb, (a or {}).get("p50_ms") if na else np.nan, (b or {}).get("p50_ms") if nb else np.nan,
                         (a or {}).get("p99_ms") if na else np.nan, (b or {}).get("p99_ms") if nb else np.nan))
    return np.array(rows, dtype=float).reshape(-1, 6).T


def _share(a, b, axis=-1):
    return a.sum(axis=axis) / (a.sum(axis=axis) + b.sum(axis=axis))


def _ratio(a, b, axis=-1):
    return a.sum(axis=axis) / b.sum(axis=axis)


def _mean_ratio(a, b, axis=-1):
    return a.mean(axis=axis) / b.mean(axis=axis)


def interval(data, statistic):
    """``{"value", "low", "high", "n"}``: ``statistic(*data)`` and its bootstrap interval.

    ``data``: equal-length 1-d arrays, resampled together (paired). Fewer than 2 samples,
    or all resamples alike, give ``low == high == value`` (no spread can be estimated:
    the report says n).
    """
    n = len(data[0])
    if n == 0:
        return None
    value = float(statistic(*data))
    if n < 2:
        return {"value": value, "low": value, "high": value, "n": n}
    with np.errstate(divide="ignore", invalid="ignore"):
        res = stats.bootstrap(tuple(data), statistic, paired=True, vectorized=True, axis=-1,
                              n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE, method="percentile",
                              rng=np.random.default_rng(SEED))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):
        low = high = value
    return {"value": value, "low": low, "high": high, "n": n}


def summarize(runs, kind, paths=PATHS):
    """``{path: {"share", "rps_ratio", "p50_ratio", "p99_ratio"}}`` (each an :func:`interval`)
    over the windows of the runs of ``kind``; paths without requests are left out."""
    out = {}
    for path in paths:
        na, nb, p50a, p50b, p99a, p99b = _samples(runs, kind, path)
        if not len(na):
            continue
        both = (na > 0) & (nb > 0)  # a ratio of latencies needs both in the window
        out[path] = {
            "share": interval((na, nb), _share),
            "rps_ratio": interval((na, nb), _ratio) if nb.sum() else None,
            "p50_ratio": interval((p50a[both], p50b[both]), _mean_ratio),
            "p99_ratio": interval((p99a[both], p99b[both]), _mean_ratio),
        }
    return out


def slot_share(runs):
    """Share of slot ``a`` (first in HAProxy's list, lower port) over the A/B runs' windows,
    all paths: 0.5 means no position effect (the servers alternate between slots)."""
    relabelled = [dict(run, labels={"A": run["slot_names"]["a"], "B": run["slot_names"]["b"]})
                  for run in runs if run["kind"] == "ab"]
    return interval(_samples(relabelled, "ab", "all")[:2], _share) if relabelled else None


def floor(aa_stats, path):
    """A/A noise floor of ``path`` in share points (0..1): the largest distance of the A/A
    interval's ends from 0.5; None without an A/A control."""
    entry = (aa_stats or {}).get(path, {}).get("share")
    if not entry:
        return None
    return max(abs(entry["low"] - 0.5), abs(entry["high"] - 0.5))


def verdict(path, ab_stats, aa_stats, name_a="pyruvate"):
    """One sentence: does ``name_a`` finish more or less of ``path`` than 50 % beyond the floor?

    Returns ``(detected: bool, text)``. Detected means the whole 95 % interval of the
    A/B share lies outside 50 % ± the A/A floor (± 0 without a control run, ``aa_stats``
    None, or when the control finished no request of ``path``; the text says which).
    """
    share = ab_stats.get(path, {}).get("share")
    label = "all paths" if path == "all" else path
    if not share:
        return False, f"{label}: no requests"
    f = floor(aa_stats, path)
    margin = f or 0.0
    if f is not None:
        where = f"the A/A floor of ±{100 * f:.1f}"
    elif aa_stats is None:
        where = "50% (no A/A control run: the noise floor is unknown, use --control)"
    else:  # a short control run can miss a rare path (the blob) altogether
        where = f"50% (the A/A control finished no {label}: its noise floor is unknown)"
    text = (f"{name_a} finishes {100 * share['value']:.1f}% of {label} "
            f"(95% CI {100 * share['low']:.1f}–{100 * share['high']:.1f}%, {share['n']} windows)")
    if share["n"] < 2:
        return False, f"{label}: no difference detected: {text}: too few windows for an interval"
    if share["low"] > 0.5 + margin:
        return True, f"{text}, above {where}"
    if share["high"] < 0.5 - margin:
        return True, f"{text}, below {where}"
    return False, f"{label}: no difference detected: {text}, within {where}"


def time_verdict(path, ab_time, aa_time, name_a="pyruvate", name_b="waitress"):
    """One sentence on the servers' own time (HAProxy ``Tr`` p50 ratio, A/B) of ``path``,
    with the A/A interval of the same ratio when there is one. Returns ``(detected, text)``:
    detected when the A/B interval and the A/A interval (or 1.0 without one) do not overlap.

    ``ab_time``/``aa_time``: :func:`summarize` results over the HAProxy log windows;
    ``aa_time`` None means no control run. A ratio needs a window in which both servers
    answered ``path``: a short run on a busy machine can have none for a rare path (the
    A/A run of a 6 s CI round had none of "/Plone + @json", 26 Nov), and the text says so
    rather than pretending there was no control.
    """
    ratio = (ab_time or {}).get(path, {}).get("p50_ratio")
    if not ratio:
        return False, f"{path}: no server times (no window in which both servers answered it)"
    aa = (aa_time or {}).get(path, {}).get("p50_ratio")
    low, high = (aa["low"], aa["high"]) if aa else (1.0, 1.0)
    detected = ratio["n"] >= 2 and (ratio["high"] < low or ratio["low"] > high)
    if aa:
        control = f"; A/A {aa['low']:.2f}–{aa['high']:.2f})"
    elif aa_time is None:
        control = "; no A/A control)"
    else:
        control = "; the A/A control has no window in which both answered it: its noise floor is unknown)"
    text = (f"{name_a}'s own time to the response headers (HAProxy Tr, p50) on {path} is "
            f"{ratio['value']:.2f}× {name_b}'s (95% CI {ratio['low']:.2f}–{ratio['high']:.2f}" + control)
    return detected, text + ("" if detected else ": no difference detected")


def rounds_report(meta, runs):
    """The report dict of a rounds invocation: ``{"meta", "runs", "stats": {"ab", "aa"},
    "slot_share", "verdicts": [{"path", "detected", "text"}], "warnings"}`` (shares as
    fractions 0..1; see loadtests.ab.abstats)."""
    ab = summarize(runs, "ab")
    aa = summarize(runs, "aa") if meta["control"] else None
    verdicts = []
    # Every path of the locustfile, also one the A/B run finished none of (a 6 s run on a
    # busy machine can miss /Plone): the report says "no requests" instead of leaving it out.
    for path in dict.fromkeys(PATHS + tuple(ab)):
        if path in OPT_IN_PATHS and path not in ab:
            continue
        detected, text = verdict(path, ab, aa, meta["name_a"])
        verdicts.append({"path": path, "detected": detected, "text": text})
    # The same statistics over HAProxy's log: request counts and the servers' own time (Tr).
    by_log = [dict(run, windows=run["server_time_windows"]) for run in runs]
    log_paths = tuple(LOG_PATHS.values()) + ("all",)
    server_time = {"ab": summarize(by_log, "ab", log_paths),
                   "aa": summarize(by_log, "aa", log_paths) if meta["control"] else None}
    # No server-time ratio of all paths pooled: its p50 depends on the mix of paths each
    # server got in a window (the one that got more of the fast "/" looks faster), so even
    # the A/A control's interval could miss 1 (1.05-2.05 in a 2-round demo). Its request
    # counts stay, as the check of Locust's.
    for summary in server_time.values():
        if summary and "all" in summary:
            summary["all"].update(p50_ratio=None, p99_ratio=None)
    for path in LOG_PATHS.values():
        detected, text = time_verdict(path, server_time["ab"], server_time["aa"], meta["name_a"],
                                              meta["name_b"])
        verdicts.append({"path": path, "detected": detected, "text": text, "measure": "server time"})
    warnings = sorted({w for run in runs for w in run["warnings"]})
    return {"meta": meta, "runs": runs, "stats": {"ab": ab, "aa": aa}, "server_time": server_time,
            "slot_share": slot_share(runs), "verdicts": verdicts, "warnings": warnings}


def widths_by_rounds(runs, rounds):
    """``{k: {kind: {path: half-width of the share interval in points}}}`` for the first
    k = 1..rounds rounds of a report's ``runs``: how the interval narrows with rounds."""
    out = {}
    for k in range(1, rounds + 1):
        subset = [run for run in runs if run["round"] <= k]
        out[k] = {}
        for kind in ("ab", "aa"):
            summary = summarize(subset, kind)
            out[k][kind] = {path: round(50 * (s["share"]["high"] - s["share"]["low"]), 2)
                            for path, s in summary.items()}
    return out


def main(argv=None):
    """``python -m loadtests.ab.abstats DIR``: from DIR/report.json of a rounds run, print the
    half-width (percentage points) of each path's share interval using its first 1, 2, ...
    rounds, for A/B and A/A."""
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(prog="python -m loadtests.ab.abstats", description=main.__doc__)
    parser.add_argument("directory", help="a report folder of loadtests.ab.abtest (rounds run)")
    args = parser.parse_args(argv)
    with open(os.path.join(args.directory, "report.json"), encoding="utf-8") as fp:
        data = json.load(fp)
    widths = widths_by_rounds(data["runs"], data["meta"]["rounds"])
    ran = {p for kinds in widths.values() for paths in kinds.values() for p in paths}
    columns = [p for p in PATHS if p not in OPT_IN_PATHS or p in ran]
    print("| rounds | kind | " + " | ".join(columns) + " |")
    print("|---:|---|" + "---:|" * len(columns))
    for k, kinds in widths.items():
        for kind, paths in kinds.items():
            if paths:
                print(f"| {k} | {kind} | " + " | ".join(f"±{paths.get(p, float('nan')):.1f}" for p in columns) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
