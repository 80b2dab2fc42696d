"""``python -m loadtests canary-judge``: the command line of the canary's judge
(:mod:`loadtests.ab.canary`, where the rules and their defaults are): read HAProxy's logs,
judge, write ``report.json``, ``report.md`` and ``canary.png`` (:mod:`loadtests.ab.canary_report`)
and exit 0 (promote), 1 (rollback), 3 (not enough data) or 2 (could not judge).
"""
import os
import sys

from loadtests.ab.canary import (CLASSES, DEFAULT_MAX_ERROR_INCREASE, DEFAULT_MAX_SLOWDOWN, DEFAULT_MIN_REQUESTS,
                                 DEFAULT_WINDOW_S, EXIT_STATUS, MIN_WINDOWS, JudgeError, check_phases, judge,
                                 parse_time, read_lines)


def parse_args(argv):
    from loadtests.core.cli import add_stack_arguments, new_parser
    from loadtests.core.stack import ROOT

    parser = new_parser(
        "canary-judge", "Judge a canary from HAProxy's request log with the A/B statistics: promote (exit 0), "
        "roll back (exit 1) or not enough data (exit 3); 2 when it could not judge.",
        epilog="Times: epoch seconds, ISO 8601 (local time unless it has an offset) or HAProxy's "
        "28/Nov/2026:10:00:00. How the verdict is reached: docs/explanation/canary.md.")
    parser.add_argument("--log", action="append", default=None, metavar="FILE",
                        help="HAProxy's request log (repeatable, oldest first; default the stack's "
                        "var/log/haproxy.stdout.log)")
    parser.add_argument("--canary", required=True, metavar="SERVER",
                        help="the canary's HAProxy server name (as in the log's backend/server)")
    parser.add_argument("--compare", required=True, metavar="SERVER[,SERVER]",
                        help="its comparison clients' server names, comma-separated (the same WSGI server)")
    parser.add_argument("--aa-from", metavar="TIME", help="start of the A/A phase (default: the log's first line)")
    parser.add_argument("--aa-until", required=True, metavar="TIME",
                        help="end of the A/A phase (the canary on the old release)")
    parser.add_argument("--ab-from", metavar="TIME",
                        help="start of the A/B phase (the canary on the new release; default --aa-until)")
    parser.add_argument("--ab-until", metavar="TIME", help="end of the A/B phase (default: the log's last line)")
    parser.add_argument("--max-slowdown", type=float, default=DEFAULT_MAX_SLOWDOWN, metavar="FRACTION",
                        help="Tr p50/p99 slowdown tolerated beyond the A/A floor, a fraction "
                        f"(default {DEFAULT_MAX_SLOWDOWN:g})")
    parser.add_argument("--max-error-increase", type=float, default=DEFAULT_MAX_ERROR_INCREASE,
                        metavar="FRACTION",
                        help="error-rate excess tolerated beyond the A/A floor, a fraction "
                        f"(default {DEFAULT_MAX_ERROR_INCREASE:g})")
    parser.add_argument("--min-requests", type=int, default=DEFAULT_MIN_REQUESTS, metavar="N",
                        help=f"requests per class, side and phase needed (default {DEFAULT_MIN_REQUESTS})")
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, metavar="SECONDS",
                        help=f"seconds per window, the unit the intervals resample (default {DEFAULT_WINDOW_S:g}; "
                        f"each phase needs {MIN_WINDOWS} in which both sides answered a class)")
    parser.add_argument("--classes", default=",".join(CLASSES), metavar="CLASS[,CLASS]",
                        help=f"the path classes judged (default {','.join(CLASSES)})")
    add_stack_arguments(parser, stack_config=False)
    args = parser.parse_args(argv)
    args.log = args.log or [os.path.join(ROOT, "var", "log", "haproxy.stdout.log")]
    args.compare = [name for name in args.compare.split(",") if name]
    args.classes = [name for name in args.classes.split(",") if name]
    try:
        args.phases = {
            "aa": (parse_time(args.aa_from) if args.aa_from else None, parse_time(args.aa_until)),
            "ab": (parse_time(args.ab_from or args.aa_until), parse_time(args.ab_until) if args.ab_until else None)}
        check_phases(args.phases)
    except JudgeError as exc:
        parser.error(str(exc))
    return args


def main(argv=None):
    """Judge, write report.json, report.md and canary.png into ``--out``/canary-judge-<time>/,
    print the Markdown; returns the exit status (:data:`EXIT_STATUS`, 2 when it could not
    judge)."""
    from loadtests.ab import canary_report
    from loadtests.core.reports import report_folder

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        data = judge(read_lines(args.log), args.canary, args.compare, args.phases,
                     max_slowdown=args.max_slowdown, max_error_increase=args.max_error_increase,
                     min_requests=args.min_requests, window_s=args.window, classes=args.classes)
    except JudgeError as exc:
        print(f"canary-judge: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"canary-judge: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    data["settings"]["logs"] = list(args.log)
    folder = report_folder(args.out, "canary-judge")
    canary_report.write(folder, data)
    print(canary_report.markdown(data))
    print(f"report: {folder}")
    return EXIT_STATUS[data["verdict"]]


if __name__ == "__main__":
    sys.exit(main())
