"""``python -m loadtests canary-bench``: how sensitive the default canary is (issue 29, "Done when").

A benchmark, not a test (not in ``make test``): on the running buildout stack it builds
releases of this checkout that differ from the current build only by ``added-delay`` on the
canary's part (:func:`loadtests.ab.canary_deploy.make_release`: ``var/canary-releases/<name>``,
``var`` a link to the stack's), ``--identical`` of them with no delay and one per
``--delays`` value, then runs one canary deploy per release
(:func:`loadtests.ab.canary_deploy.deploy`: A/A on the current build, A/B on the release,
back onto the current build) one after the other under one Locust load through HAProxy, the
identical releases interleaved with the slower ones, and judges each with the default judge
(:func:`loadtests.ab.canary.judge`, its defaults). It prints, and writes into
``var/reports/canary-bench-<time>/`` (``report.md``, ``report.json``):

- per release: the verdict, the page class's Tr p50 ratio with its 95 % interval and limit,
  and for a rollback after how many of the canary's page requests of the A/B phase the judge
  first said so (:func:`detection`: the judge on the A/B phase cut after 10, 11, ... windows);
- the smallest added delay rolled back, after how many requests; the false-rollback rate over
  the identical releases (rollbacks / identical releases, with the counts), and how many of
  those were promoted or "not enough data";
- the load's requests and failures (0 expected: every switch is drained).

Units: delays in ms, phases and switches in seconds, ratios canary / comparison.
"""
import json
import os
import sys
import time

from loadtests.ab import canary, canary_deploy
from loadtests.core import haproxy_log
from loadtests.core.stack import NotReady, load_stack
from plonedeploy.stack import rolling
from plonedeploy.stack.errors import StackError

DEFAULT_DELAYS = (5, 10, 20, 50)
DEFAULT_IDENTICAL = 5


def release_plan(delays, identical):
    """``[(name, delay ms)]`` in the order they are deployed: the identical releases
    (``same-1`` ...) alternating with the slower ones (``delay-<ms>``, the largest delay first:
    a run cut short has the plain cases), so that both kinds meet the machine's drifts alike;
    the rest of the longer list at the end."""
    same = [(f"same-{number}", 0) for number in range(1, identical + 1)]
    slower = [(f"delay-{ms}", ms) for ms in sorted(delays, reverse=True)]
    plan = []
    for index in range(max(len(same), len(slower))):
        plan += same[index:index + 1] + slower[index:index + 1]
    return plan


def detection(lines, name, compare, phases, classes, window_s=canary.DEFAULT_WINDOW_S):
    """When the default judge first rolls back within the A/B phase of ``phases``: the judge
    on the phase cut after ``MIN_WINDOWS``, ``MIN_WINDOWS`` + 1, ... windows of ``window_s``
    seconds (the A/A phase whole). Returns ``{"seconds": the A/B seconds judged, "requests":
    the canary's page requests among them}`` at the first rollback, or None when none is.
    ``lines``: a list (read more than once)."""
    ab_from, ab_until = phases["ab"]
    cut = ab_from + canary.MIN_WINDOWS * window_s
    while True:
        cut = min(cut, ab_until)
        data = canary.judge(lines, name, compare, {"aa": phases["aa"], "ab": (ab_from, cut)}, classes=classes)
        if data["verdict"] == canary.ROLLBACK:
            page = data["classes"].get("page", {}).get("stats", {}).get("ab", {}).get("counts", {})
            return {"seconds": round(cut - ab_from, 1), "requests": page.get(canary.CANARY, {}).get("requests")}
        if cut >= ab_until:
            return None
        cut += window_s


def analyse(lines, name, compare, plan, timelines, classes):
    """One row per deploy: ``plan``'s ``(release, delay ms)`` and its :func:`deploy` timeline
    judged from HAProxy log ``lines`` (any iterable; only the lines of each deploy's phases
    are kept): ``{"name", "delay_ms", "verdict", "reasons", "page_p50" (the A/B interval of
    the page Tr p50 ratio, or None), "page_limit", "judged_requests" (the judge's: both
    phases, both sides, every class), "canary_ab_pages" (the canary's page requests of the
    A/B phase, or None), "detected" (:func:`detection`, for a rollback), "phases",
    "switch_s"}``."""
    bounds = [(timeline["phases"]["aa"][0], timeline["phases"]["ab"][1]) for timeline in timelines]
    kept = [[] for _ in timelines]
    for line in lines:
        epoch = haproxy_log.accepted_epoch(line)
        for index, (start, end) in enumerate(bounds):
            if start <= epoch < end:
                kept[index].append(line)
    rows = []
    for (release, delay), timeline, lines_of in zip(plan, timelines, kept):
        data = canary.judge(lines_of, name, compare, timeline["phases"], classes=classes)
        page = data["classes"].get("page", {})
        ab = page.get("stats", {}).get("ab", {})
        rows.append({"name": release, "delay_ms": delay, "verdict": data["verdict"], "reasons": data["reasons"],
                     "page_p50": ab.get("p50_ratio"), "page_limit": page.get("limits", {}).get("p50_ratio"),
                     "judged_requests": data["judged_requests"],
                     "canary_ab_pages": ab.get("counts", {}).get(canary.CANARY, {}).get("requests"),
                     "detected": (detection(lines_of, name, compare, timeline["phases"], classes)
                                  if data["verdict"] == canary.ROLLBACK else None),
                     "phases": timeline["phases"], "switch_s": timeline["switch_s"]})
    return rows


def summarize(rows):
    """The benchmark's findings from its per-release ``rows`` (dicts with ``delay_ms``,
    ``verdict``, ``detected``: :func:`detection`'s or None): ``{"identical", "false_rollbacks",
    "false_rollback_rate", "identical_verdicts": {verdict: count}, "smallest_detected_ms",
    "detected_after": detection of it, "missed_ms": [delays not rolled back]}``."""
    same = [row for row in rows if row["delay_ms"] == 0]
    verdicts = {}
    for row in same:
        verdicts[row["verdict"]] = verdicts.get(row["verdict"], 0) + 1
    rolled = sorted((row for row in rows if row["delay_ms"] and row["verdict"] == canary.ROLLBACK),
                    key=lambda row: row["delay_ms"])
    return {"identical": len(same), "false_rollbacks": verdicts.get(canary.ROLLBACK, 0),
            "false_rollback_rate": verdicts.get(canary.ROLLBACK, 0) / len(same) if same else None,
            "identical_verdicts": verdicts,
            "smallest_detected_ms": rolled[0]["delay_ms"] if rolled else None,
            "detected_after": rolled[0]["detected"] if rolled else None,
            "missed_ms": sorted(row["delay_ms"] for row in rows
                                if row["delay_ms"] and row["verdict"] != canary.ROLLBACK)}


def _ratio(row):
    entry = row.get("page_p50")
    if not entry:
        return "–"
    return f"{entry['value']:.2f}× ({entry['low']:.2f}–{entry['high']:.2f})"


def markdown(data):
    """report.md of the benchmark's ``data`` (:func:`main`'s report.json)."""
    found, settings = data["summary"], data["settings"]
    lines = [f"# Canary sensitivity: {settings['canary']} against {', '.join(settings['compare'])}", "",
             f"{data['started']}, load average before {settings['load_before']}, after {data['load_after']}; "
             f"phases {settings['phase_s']:g} s, Locust {settings['users']} users ({settings['weights']}), "
             f"classes {','.join(settings['classes'])}, the judge's defaults.", "",
             "| release | added delay | verdict | page Tr p50 ratio (95% CI) | limit | requests judged "
             "| canary's A/B pages | rolled back after |",
             "|---|---:|---|---|---:|---:|---:|---|"]
    for row in data["releases"]:
        after = (f"{row['detected']['requests']} page requests ({row['detected']['seconds']:g} s)"
                 if row["detected"] else "–")
        limit = f"{row['page_limit']:.2f}×" if row.get("page_limit") else "–"
        judged = f"{row['judged_requests']:,}" if row.get("judged_requests") is not None else "–"
        pages = f"{row['canary_ab_pages']:,}" if row.get("canary_ab_pages") is not None else "–"
        lines.append(f"| {row['name']} | {row['delay_ms']} ms | {row['verdict']} | {_ratio(row)} | {limit} | {judged} "
                     f"| {pages} | {after} |")
    smallest = found["smallest_detected_ms"]
    lines += ["", (f"Smallest added delay rolled back: {smallest} ms, after {found['detected_after']['requests']} of "
                   f"the canary's page requests ({found['detected_after']['seconds']:g} s of its A/B phase)."
                   if smallest is not None else "No added delay was rolled back."),
              f"Not rolled back: {', '.join(f'{ms} ms' for ms in found['missed_ms']) or 'none'}.",
              f"False rollbacks: {found['false_rollbacks']} of {found['identical']} identical releases "
              f"({', '.join(f'{n} {verdict}' for verdict, n in sorted(found['identical_verdicts'].items()))}).",
              f"Load: {data['load']['requests']} requests, {data['load']['errors']} failed (Locust); HAProxy logged "
              f"{data['haproxy']['errors']} errors of {data['haproxy']['requests']} requests from the first A/A phase "
              f"on; switches {min(data['switch_s']):.1f}–{max(data['switch_s']):.1f} s."]
    return "\n".join(lines) + "\n"


def parse_args(argv):
    from loadtests.core.cli import add_counts_argument, add_stack_arguments, new_parser

    parser = new_parser(
        "canary-bench", "The default canary's sensitivity on the running stack: canary deploys of releases that "
        "differ only by an added page delay, and of identical ones; the smallest delay rolled back, after how many "
        "requests, and the false-rollback rate.", epilog="docs/explanation/canary.md#sensitivity")
    add_counts_argument(parser, "--delays", ",".join(map(str, DEFAULT_DELAYS)),
                        "added delays (ms) of the slower releases, one release each")
    parser.add_argument("--identical", type=int, default=DEFAULT_IDENTICAL,
                        help=f"releases identical to the current build (default {DEFAULT_IDENTICAL})")
    parser.add_argument("--canary", metavar="CLIENT", help="the canary (default as canary-deploy chooses)")
    parser.add_argument("--phase", type=float, default=canary_deploy.DEFAULT_PHASE_S, metavar="SECONDS",
                        help=f"seconds of each A/A and A/B phase (default {canary_deploy.DEFAULT_PHASE_S:g})")
    parser.add_argument("--warmup", type=float, default=canary_deploy.DEFAULT_WARMUP_S, metavar="SECONDS",
                        help=f"seconds of load before the first deploy (default {canary_deploy.DEFAULT_WARMUP_S:g})")
    parser.add_argument("--settle", type=float, default=canary_deploy.DEFAULT_SETTLE_S, metavar="SECONDS",
                        help=f"seconds after each restart before a phase (default {canary_deploy.DEFAULT_SETTLE_S:g})")
    parser.add_argument("--users", type=int, default=canary_deploy.DEFAULT_USERS,
                        help=f"Locust users (default {canary_deploy.DEFAULT_USERS})")
    parser.add_argument("--weights", default=canary_deploy.DEFAULT_WEIGHTS,
                        help=f"the locustfile's shapes (default {canary_deploy.DEFAULT_WEIGHTS})")
    parser.add_argument("--classes", default=",".join(canary_deploy.DEFAULT_CLASSES), metavar="CLASS[,CLASS]",
                        help=f"the classes judged (default {','.join(canary_deploy.DEFAULT_CLASSES)})")
    parser.add_argument("--analyse", metavar="DEPLOYS_JSON",
                        help="deploy nothing: judge and report the deploys a run recorded (its deploys.json, "
                        "written after each deploy: a run stopped early), into that run's folder")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    args.classes = [name for name in args.classes.split(",") if name]
    if args.identical < 1 or not args.phase > 0 or args.users < 1:
        parser.error("--identical and --users must be >= 1, --phase > 0")
    return args


def record(folder, settings, plan, timelines, log, started, load=None):
    """Write ``folder/deploys.json``: what :func:`main`'s deploys did so far (``plan``'s steps
    done, their :func:`loadtests.ab.canary_deploy.deploy` ``timelines``, HAProxy's ``log``) and,
    once the load stopped, its ``load`` row; ``--analyse`` judges and reports from it."""
    with open(os.path.join(folder, "deploys.json"), "w", encoding="utf-8") as fp:
        json.dump({"settings": settings, "plan": plan, "timelines": timelines, "log": log, "started": started,
                   "load": load}, fp, indent=2)


def report(folder, settings, plan, timelines, log, load, started, status=0):
    """Judge the deploys (:func:`analyse` of HAProxy's ``log``), write ``report.json`` and
    ``report.md`` into ``folder``, print the Markdown; returns ``status``. ``load``: the
    load's :func:`loadtests.core.locustrun.row_of` (None when a stopped run has none)."""
    from loadtests.core.reports import write_report

    lines = list(canary.read_lines([log]))
    rows = analyse(lines, settings["canary"], settings["compare"], plan, timelines, settings["classes"])
    # Every request HAProxy answered from the first A/A phase on, the switches included.
    served = canary_deploy.failed_lines(lines, timelines[0]["phases"]["aa"][0], float("inf"))
    data = {"started": started, "load_after": " ".join(f"{value:.2f}" for value in os.getloadavg()),
            "settings": settings, "releases": rows, "summary": summarize(rows), "haproxy": served,
            "load": load or {"requests": None, "errors": None},
            "switch_s": [s for timeline in timelines for s in timeline["switch_s"]]}
    text = markdown(data)
    write_report(folder, data, text)
    print(text)
    print(f"report: {folder}")
    return status


def main(argv=None):
    """Build the releases, deploy each as the canary under one load, judge, print and write the
    report; returns 0, or 2 when it could not run (the stack, a build, a switch; the deploys
    done before a failed switch are reported all the same)."""
    from loadtests.core.locustrun import BackgroundLocust
    from loadtests.core.reports import report_folder

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.analyse:
        with open(args.analyse, encoding="utf-8") as fp:
            done = json.load(fp)
        return report(os.path.dirname(os.path.abspath(args.analyse)), done["settings"],
                      [tuple(step) for step in done["plan"]], done["timelines"], done["log"], done.get("load"),
                      done.get("started", "?"))
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    load_before = " ".join(f"{value:.2f}" for value in os.getloadavg())
    try:
        stack = load_stack(args.stack_config)
        name, compare = canary_deploy.choose(stack, args.canary)
        canary_deploy.check_up(stack)
        plan = release_plan(args.delays, args.identical)
        releases = {}
        for release, delay in plan:
            directory = os.path.join(canary_deploy.RELEASES_DIR, release)
            took = canary_deploy.make_release(directory, name, delay)
            releases[release] = canary_deploy.check_release(stack, directory, name)
            print(f"{release}: built in {took:.0f} s ({directory}, added-delay {delay} ms)", flush=True)
    except (canary_deploy.CanaryError, NotReady, RuntimeError) as exc:
        print(f"canary-bench: {exc}", file=sys.stderr)
        return 2
    log = canary_deploy.log_path(stack)
    load = BackgroundLocust(stack["frontend_url"], args.weights, args.users).start()
    timelines, status = [], 0
    folder = report_folder(args.out, "canary-bench")
    settings = {"canary": name, "compare": compare, "delays_ms": args.delays, "identical": args.identical,
                "phase_s": args.phase, "settle_s": args.settle, "warmup_s": args.warmup, "users": args.users,
                "weights": args.weights, "classes": args.classes, "load_before": load_before,
                "command": "python -m loadtests canary-bench " + " ".join(sys.argv[1:] if argv is None else argv)}
    try:
        time.sleep(args.warmup)
        for release, delay in plan:
            if not load.running():
                raise canary_deploy.CanaryError("Locust exited")
            print(f"{release}: canary deploy ({delay} ms added)", flush=True)
            timelines.append(canary_deploy.deploy(stack, name, releases[release], args.phase,
                                                  settle_s=args.settle))
            # What the deploys did so far: a run stopped, or an analysis that failed, can be
            # judged again from it (analyse()).
            record(folder, settings, plan[:len(timelines)], timelines, log, started)
    except (canary_deploy.CanaryError, rolling.RollingError, StackError) as exc:
        # The deploys done so far are still judged and reported.
        print(f"canary-bench: {exc}", file=sys.stderr)
        status = 2
    row = load.stop()
    if not timelines:
        return status
    # the load's figures too: --analyse of a finished run reports them as the run did
    record(folder, settings, plan[:len(timelines)], timelines, log, started, row)
    return report(folder, settings, plan[:len(timelines)], timelines, log, row, started, status)

if __name__ == "__main__":
    sys.exit(main())
