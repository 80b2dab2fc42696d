"""The canary's judge: promote, roll back, or "not enough data", from HAProxy's request log.

    python -m loadtests canary-judge --canary SERVER --compare SERVER[,SERVER] --aa-until TIME [...]

A canary deploy (issue 29) runs one ZEO client first on the *old* release (the A/A phase) and
then on the *new* one (the A/B phase) beside its comparison clients, all behind one HAProxy.
This module reads the lines HAProxy logged for the requests that reached those clients
(``option httplog``; parsed by :mod:`loadtests.core.haproxy_log`) and judges with the A/B
statistics of :mod:`loadtests.ab.abstats` (the same bootstrap, windows and ratios):

1. Every line is put in a phase by the time HAProxy accepted its request (``--aa-from`` ..
   ``--aa-until``, ``--ab-from`` .. ``--ab-until``; lines in neither, such as the canary's
   restart between them, are left out), on a side (the canary, or the comparison clients
   together) and in a path class (:func:`plonedeploy.runtime.pathclass.path_class`: page,
   json, blob, write), then in a time window of ``window_s`` seconds (the unit the bootstrap
   resamples).
2. Per window, side and class: requests, errors (:func:`is_error`: 5xx, or a response the
   server aborted or timed out), and the server times ``Tr`` (ms from the request sent to the
   server until its response headers: Zope's own time, without HAProxy's queue) of the other
   responses, summarised as p50 and p99 (:func:`loadtests.core.haproxy_log.time_summary`).
3. Per phase and class, :func:`loadtests.ab.abstats.summarize` gives the canary's p50 and p99
   ratio to the comparison's (mean over windows of the canary's p50 / the same of the
   comparison's) with its 95 % bootstrap interval, and :func:`loadtests.ab.abstats.interval`
   the error-rate excess (canary's rate minus the comparison's, a fraction) with its own.
4. Per class (:func:`judge_class`): the A/A phase is the noise floor. A latency ratio's limit
   is the upper end of its A/A interval × (1 + ``max_slowdown``); the error excess's limit is
   the upper end of its A/A interval (at least 0) + ``max_error_increase``. The class is
   **worse** when the whole A/B interval lies above a limit; **undecided** when the A/B
   value is above a limit but its interval reaches below it (more requests would tell);
   else it **passes**. A class with fewer than ``min_requests`` requests on either side in
   either phase, or fewer than ``MIN_WINDOWS`` windows in which both sides answered it, is
   **not enough data**; a class nobody requested in either phase is **no traffic** (listed,
   not judged).
5. The verdict (:func:`verdict`): ``rollback`` if any class is worse (the reasons name the
   class and the figure); else ``not enough data`` if any class lacks data or is undecided,
   or no class was judged at all; else ``promote``. Never a promote without evidence.

Exit status of the subcommand: 0 promote, 1 rollback, 3 not enough data, 2 when it could not
judge (bad options, an unreadable log). Units: times in ms (``Tr``) and epoch seconds (phase
bounds), rates and tolerances as fractions (0.10 = 10 %), ratios canary / comparison.

What it cannot see (docs/explanation/canary.md): requests that never reached a ZEO client
(answered by varnish, refused by HAProxy), the Accept header (JSON asked for by content
negotiation on a page URL counts as page), a request HAProxy retried elsewhere after a failed
connection (logged under the server that answered), the time a blob's body takes (``Tr`` ends
at the response headers), and a difference smaller than the A/A floor.
"""
from datetime import datetime

import numpy as np
# The path classes: one rule with the client's delay filter (plonedeploy.runtime.pathclass says why
# it lives there); re-exported here, where the judge's callers have always found them.
from plonedeploy.runtime.pathclass import BLOB_VIEW, CLASSES, JSON_ROUTE, WRITE_METHODS, path_class  # noqa: F401

from loadtests.ab import abstats
from loadtests.core import haproxy_log

#: The sides of the comparison (abstats' labels A and B).
CANARY, COMPARISON = "canary", "comparison"
PHASES = ("aa", "ab")
PHASE_NAMES = {"aa": "A/A", "ab": "A/B"}

#: Defaults (issue 29: canary_max_slowdown 10 %).
DEFAULT_MAX_SLOWDOWN = 0.10
#: An error-rate excess of 0.1 point (1 request in 1,000) beyond the A/A floor is tolerated:
#: a Plone site answers the odd 5xx with no release to blame (a ConflictError after its last
#: retry, a timeout under a burst); more than that, confirmed by the interval, is the release's.
DEFAULT_MAX_ERROR_INCREASE = 0.001
#: Requests per class, side and phase below which nothing is judged. 200: below it a p99 rests
#: on one or two requests, and the p50 ratio's 95 % interval of two identical servers is wider
#: than the 10 % tolerance itself (±10-15 %, median ±12.7 %, over 10 phases of 200 requests a
#: side in 30 windows, server times log-normal with sigma 0.5; tests/test_canary_judge.py
#: checks it): a verdict could not be earned with less. More requests narrow it (±9 % at 400).
DEFAULT_MIN_REQUESTS = 200
#: Seconds per window (the bootstrap's resampling unit). Longer than the A/B's 5 s: live
#: traffic to one canary is sparser than Locust's, and a window's p99 needs requests in it.
DEFAULT_WINDOW_S = 10.0
#: Windows in which both sides answered a class, at the least, for an interval to mean much.
MIN_WINDOWS = 10

#: Verdicts, and the subcommand's exit status for each.
PROMOTE, ROLLBACK, NOT_ENOUGH = "promote", "rollback", "not enough data"
EXIT_STATUS = {PROMOTE: 0, ROLLBACK: 1, NOT_ENOUGH: 3}


class JudgeError(ValueError):
    """Options the judge cannot work with (a bad time, a canary among its comparison, ...)."""


# ----------------------------------------------------------------------------- lines

def is_error(line):
    """True for a failed request: a 5xx status (Zope's 500, HAProxy's 502/503/504 when the
    server failed, refused or timed out), or a termination state whose first letter blames
    the server (``S``: it aborted, ``s``: it timed out), also after a 200's headers."""
    return line["status"] >= 500 or line["termination"][:1] in ("S", "s")


def parse_time(text):
    """Epoch seconds of ``text``: a number (epoch seconds), ISO 8601 (``2026-11-28T10:00:00``;
    without an offset it is local time, as HAProxy's log is) or HAProxy's own date
    (``28/Nov/2026:10:00:00.000``, local time). JudgeError for anything else."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    for parse in (datetime.fromisoformat, lambda t: datetime.strptime(t, "%d/%b/%Y:%H:%M:%S.%f"),
                  lambda t: datetime.strptime(t, "%d/%b/%Y:%H:%M:%S")):
        try:
            return parse(text).timestamp()
        except ValueError:
            continue
    raise JudgeError(f"{text!r} is not a time: give epoch seconds, ISO 8601 (2026-11-28T10:00:00, local "
                     "time unless it has an offset) or HAProxy's 28/Nov/2026:10:00:00")


def phase_of(epoch, phases):
    """``"aa"``, ``"ab"`` or None: the phase whose ``[start, end)`` holds ``epoch`` (seconds).
    ``phases``: ``{"aa": (start, end), "ab": (start, end)}``, None for an open end."""
    for name in PHASES:
        start, end = phases[name]
        if (start is None or epoch >= start) and (end is None or epoch < end):
            return name
    return None


def check_phases(phases):
    """Raise JudgeError unless ``phases`` (as :func:`phase_of` takes them) has both phases,
    each starting before it ends, the A/A phase ending (a bounded ``aa`` end) no later than
    the A/B phase starts."""
    if set(phases) != set(PHASES):
        raise JudgeError(f"phases must be {PHASES}, got {sorted(phases)}")
    for name in PHASES:
        start, end = phases[name]
        if start is not None and end is not None and start >= end:
            raise JudgeError(f"the {PHASE_NAMES[name]} phase starts at or after its end")
    if phases["aa"][1] is None:
        raise JudgeError("the A/A phase needs an end (--aa-until): it is the noise floor of the A/B")
    if phases["ab"][0] is None or phases["ab"][0] < phases["aa"][1]:
        raise JudgeError("the A/B phase must start at or after the end of the A/A phase")


def tally(lines, canary, compare, phases, window_s=DEFAULT_WINDOW_S, classes=CLASSES):
    """Sort HAProxy log lines into phases, windows, sides and classes.

    ``lines``: dicts of :func:`loadtests.core.haproxy_log.lines` (any backend); ``canary``:
    the canary's HAProxy server name; ``compare``: its comparison servers' names; ``phases``
    as :func:`phase_of` takes them; ``window_s``: seconds per window; ``classes``: the
    classes judged (lines of others are counted as left out).

    Returns ``{"phases": {phase: {window: {side: {class: {"requests", "errors", "tr"}}}}},
    "servers": {phase: {server: requests}}, "left_out": {reason: lines}}``: ``window`` the
    window's number (epoch seconds // window_s), ``side`` "canary" or "comparison",
    ``tr`` the server times (ms) of the responses that were not errors.
    """
    if isinstance(compare, str):
        raise JudgeError(f"compare must be a list of server names, got the string {compare!r}")
    if canary in compare:
        raise JudgeError(f"the canary {canary!r} is also one of its comparison servers")
    if not compare:
        raise JudgeError("no comparison server")
    if not window_s > 0:
        raise JudgeError(f"window_s must be > 0 seconds, got {window_s}")
    check_phases(phases)
    out = {"phases": {name: {} for name in PHASES}, "servers": {name: {} for name in PHASES},
           "left_out": {}}

    def leave_out(reason):
        out["left_out"][reason] = out["left_out"].get(reason, 0) + 1

    compare = frozenset(compare)
    for line in lines:
        server = line["server"]
        side = CANARY if server == canary else COMPARISON if server in compare else None
        if side is None:
            leave_out("other servers")
            continue
        cls = path_class(line["method"], line["path"])
        if cls is None:
            leave_out("no request line")
            continue
        epoch = haproxy_log.accepted_epoch(line)
        phase = phase_of(epoch, phases)
        if phase is None:
            leave_out("outside both phases")
            continue
        if cls not in classes:
            leave_out(f"class {cls} not judged")
            continue
        servers = out["servers"][phase]
        servers[server] = servers.get(server, 0) + 1
        cell = out["phases"][phase].setdefault(int(epoch // window_s), {}).setdefault(side, {}).setdefault(
            cls, {"requests": 0, "errors": 0, "tr": []})
        cell["requests"] += 1
        if is_error(line):
            cell["errors"] += 1
        elif line["Tr"] >= 0:
            cell["tr"].append(line["Tr"])
    return out


# ----------------------------------------------------------------------------- statistics

def runs(counted):
    """The phases of a :func:`tally` as :mod:`loadtests.ab.abstats` runs: ``[{"kind": phase,
    "labels": {"A": "canary", "B": "comparison"}, "windows": [{"servers": {side: {class:
    {"n", "p50_ms", "p99_ms"}}}}]}]``, one per phase, windows in time order (``n``: responses
    with a server time)."""
    out = []
    for phase in PHASES:
        windows = []
        for number in sorted(counted["phases"][phase]):
            sides = counted["phases"][phase][number]
            windows.append({"start_s": number, "servers": {
                side: {cls: haproxy_log.time_summary(cell["tr"]) for cls, cell in classes.items() if cell["tr"]}
                for side, classes in sides.items()}})
        out.append({"kind": phase, "labels": {"A": CANARY, "B": COMPARISON}, "windows": windows})
    return out


def error_samples(counted, phase, cls):
    """Arrays (shape ``(windows,)``, float) of the canary's errors and requests and the
    comparison's errors and requests of ``cls`` in ``phase``, over the windows in which both
    sides had requests of it (paired, as abstats pairs the latency ratios)."""
    rows = []
    for number in sorted(counted["phases"][phase]):
        sides = counted["phases"][phase][number]
        canary, comparison = sides.get(CANARY, {}).get(cls), sides.get(COMPARISON, {}).get(cls)
        if canary and comparison:
            rows.append((canary["errors"], canary["requests"], comparison["errors"], comparison["requests"]))
    return tuple(np.array(rows, dtype=float).reshape(-1, 4).T)


def _error_excess(canary_errors, canary_requests, errors, requests, axis=-1):
    """Canary's error rate minus the comparison's, pooled over windows (vectorized as
    ``scipy.stats.bootstrap`` calls it)."""
    return canary_errors.sum(axis=axis) / canary_requests.sum(axis=axis) - errors.sum(axis=axis) / requests.sum(
        axis=axis)


def counts(counted, phase, cls):
    """``{"canary": {"requests", "errors"}, "comparison": {...}}`` of ``cls`` in ``phase``."""
    out = {side: {"requests": 0, "errors": 0} for side in (CANARY, COMPARISON)}
    for sides in counted["phases"][phase].values():
        for side, classes in sides.items():
            cell = classes.get(cls)
            if cell:
                out[side]["requests"] += cell["requests"]
                out[side]["errors"] += cell["errors"]
    return out


def statistics(counted, classes=CLASSES):
    """``{class: {phase: {"counts": counts(), "p50_ratio", "p99_ratio", "share",
    "error_excess"}}}``: the intervals (:func:`loadtests.ab.abstats.interval` dicts
    ``{"value", "low", "high", "n"}``, n in windows; None without a window in which both
    sides answered) of each class in each phase. ``share``: the canary's share of the
    answered requests (0..1), for the report."""
    summaries = {run["kind"]: abstats.summarize([run], run["kind"], classes) for run in runs(counted)}
    out = {}
    for cls in classes:
        out[cls] = {}
        for phase in PHASES:
            summary = summaries[phase].get(cls, {})
            errors = error_samples(counted, phase, cls)
            out[cls][phase] = {
                "counts": counts(counted, phase, cls),
                "p50_ratio": summary.get("p50_ratio"), "p99_ratio": summary.get("p99_ratio"),
                "share": summary.get("share"),
                "error_excess": abstats.interval(errors, _error_excess) if len(errors[0]) else None}
    return out


# ----------------------------------------------------------------------------- verdicts

def _ci(entry, fmt, unit):
    return f"{fmt(entry['value'])}{unit} (95% CI {fmt(entry['low'])}–{fmt(entry['high'])}, {entry['n']} windows)"


def judge_class(cls, stats, max_slowdown=DEFAULT_MAX_SLOWDOWN, max_error_increase=DEFAULT_MAX_ERROR_INCREASE,
                min_requests=DEFAULT_MIN_REQUESTS):
    """The verdict on one class from its :func:`statistics` entry ``stats``.

    Returns ``{"class", "verdict": "pass" | "worse" | "undecided" | "not enough data" | "no
    traffic", "reasons": [str], "limits": {"p50_ratio", "p99_ratio", "error_excess"}}``
    (limits None where not computed); the rules are the module docstring's, step 4.
    """
    result = {"class": cls, "verdict": "pass", "reasons": [], "limits": {
        "p50_ratio": None, "p99_ratio": None, "error_excess": None}}
    requests = {(phase, side): stats[phase]["counts"][side]["requests"] for phase in PHASES
                for side in (CANARY, COMPARISON)}
    if not any(requests.values()):
        result.update(verdict="no traffic", reasons=[f"{cls}: no requests in either phase: not judged"])
        return result
    short = [f"{cls}: {'the canary' if side == CANARY else 'the comparison clients'} got {n} requests in the "
             f"{PHASE_NAMES[phase]} phase (at least {min_requests} needed per side and phase)"
             for (phase, side), n in requests.items() if n < min_requests]
    if not short:
        for phase in PHASES:
            entries = [stats[phase][measure] for measure in ("p50_ratio", "p99_ratio", "error_excess")]
            windows = min(0 if entry is None else entry["n"] for entry in entries)
            if windows < MIN_WINDOWS:
                short.append(f"{cls}: {windows} windows in the {PHASE_NAMES[phase]} phase in which both sides "
                             f"answered it (at least {MIN_WINDOWS} needed: a longer phase, or a shorter --window)")
    if short:
        result.update(verdict=NOT_ENOUGH, reasons=short)
        return result
    worse, undecided = [], []
    for measure, label in (("p50_ratio", "Tr p50"), ("p99_ratio", "Tr p99")):
        aa, ab = stats["aa"][measure], stats["ab"][measure]
        limit = aa["high"] * (1 + max_slowdown)
        result["limits"][measure] = limit
        text = (f"{cls} {label} of the canary is {_ci(ab, '{:.2f}'.format, '×')} the comparison's; limit "
                f"{limit:.2f}× (A/A {aa['low']:.2f}–{aa['high']:.2f}× + {100 * max_slowdown:g}%)")
        if ab["low"] > limit:
            worse.append(text)
        elif ab["value"] > limit:
            undecided.append(text + ": above the limit, but its interval reaches below it")
    aa, ab = stats["aa"]["error_excess"], stats["ab"]["error_excess"]
    limit = max(aa["high"], 0.0) + max_error_increase
    result["limits"]["error_excess"] = limit
    rates = {side: stats["ab"]["counts"][side] for side in (CANARY, COMPARISON)}
    text = (f"{cls} errors: {rates[CANARY]['errors']} of {rates[CANARY]['requests']} on the canary, "
            f"{rates[COMPARISON]['errors']} of {rates[COMPARISON]['requests']} on the comparison clients: "
            f"excess {_ci(ab, lambda v: f'{100 * v:+.2f}', ' points')}; limit {100 * limit:+.2f} points "
            f"(A/A {100 * aa['low']:+.2f}–{100 * aa['high']:+.2f} + {100 * max_error_increase:g})")
    if ab["low"] > limit:
        worse.append(text)
    elif ab["value"] > limit:
        undecided.append(text + ": above the limit, but its interval reaches below it")
    if worse:
        result.update(verdict="worse", reasons=worse + undecided)
    elif undecided:
        result.update(verdict="undecided", reasons=undecided)
    return result


def verdict(judged):
    """``(verdict, reasons)`` over the :func:`judge_class` results ``judged``: ``rollback``
    with the reasons of the worse classes; else ``not enough data`` with those of the classes
    lacking data or undecided (or a line saying no class was judged); else ``promote`` with
    one line per class that passed."""
    worse = [r for r in judged if r["verdict"] == "worse"]
    if worse:
        return ROLLBACK, [reason for r in worse for reason in r["reasons"]]
    lacking = [r for r in judged if r["verdict"] in (NOT_ENOUGH, "undecided")]
    if lacking:
        return NOT_ENOUGH, [reason for r in lacking for reason in r["reasons"]]
    passed = [r for r in judged if r["verdict"] == "pass"]
    if not passed:
        return NOT_ENOUGH, ["no class had requests in both phases: nothing was judged"]
    return PROMOTE, [f"{r['class']}: within the limits (Tr p50 ≤ {r['limits']['p50_ratio']:.2f}×, p99 ≤ "
                     f"{r['limits']['p99_ratio']:.2f}×, error excess ≤ {100 * r['limits']['error_excess']:+.2f} "
                     "points)" for r in passed]


def judge(lines, canary, compare, phases, *, max_slowdown=DEFAULT_MAX_SLOWDOWN,
          max_error_increase=DEFAULT_MAX_ERROR_INCREASE, min_requests=DEFAULT_MIN_REQUESTS,
          window_s=DEFAULT_WINDOW_S, classes=CLASSES):
    """The whole judgement of HAProxy log ``lines`` (:func:`tally`'s arguments and the
    thresholds of :func:`judge_class`).

    Returns the report's data: ``{"verdict", "reasons", "warnings", "settings", "classes":
    {class: judge_class() result + {"stats": statistics() entry}}, "servers", "left_out",
    "judged_requests"}``; ``judged_requests`` counts the lines of both phases that were
    judged (the report says how many), ``warnings`` names a server with no line at all.
    """
    if not max_slowdown >= 0 or not max_error_increase >= 0 or min_requests < 1:
        raise JudgeError("max_slowdown and max_error_increase must be >= 0 and min_requests >= 1")
    unknown = sorted(set(classes) - set(CLASSES))
    if unknown or not classes:
        raise JudgeError(f"classes must be some of {', '.join(CLASSES)}, got {', '.join(classes) or 'none'}")
    counted = tally(lines, canary, compare, phases, window_s, classes)
    stats = statistics(counted, classes)
    judged = [judge_class(cls, stats[cls], max_slowdown, max_error_increase, min_requests) for cls in classes]
    final, reasons = verdict(judged)
    seen = {server for phase in PHASES for server in counted["servers"][phase]}
    missing = [name for name in [canary, *compare] if name not in seen]
    warnings = [f"no line of server {name} in either phase: is the name right? (HAProxy's server name, as in "
                "its log's backend/server)" for name in missing]
    return {
        "verdict": final, "reasons": reasons, "warnings": warnings,
        "settings": {"canary": canary, "compare": list(compare), "phases": {
            name: {"from": start, "until": end} for name, (start, end) in phases.items()},
            "max_slowdown": max_slowdown, "max_error_increase": max_error_increase,
            "min_requests": min_requests, "window_s": window_s, "min_windows": MIN_WINDOWS,
            "classes": list(classes)},
        "classes": {r["class"]: dict(r, stats=stats[r["class"]]) for r in judged},
        "servers": counted["servers"], "left_out": counted["left_out"],
        "judged_requests": sum(sum(servers.values()) for servers in counted["servers"].values()),
    }


def read_lines(paths):
    """The lines of HAProxy logs ``paths`` (in time order: a rotated log first), every
    backend (:func:`loadtests.core.haproxy_log.lines`). OSError when a file cannot be read."""
    for path in paths:
        yield from haproxy_log.lines(path)
