"""What each WSGI filter of the kit's pipeline costs per request, in microseconds.

    python -m loadtests filters [--client instance] [--requests 20000] [--rounds 5]

Runs :mod:`loadtests.headline.filtercost_inner` in the ZEO client's own interpreter
(``parts/<client>/bin/interpreter``: the client's eggs, as ``make build`` made them; the
stack need not run). It times each filter alone, Zope's stock pipeline (``translogger
httpexceptions``), the kit's (``blobsendfile metrics translogger httpexceptions``) and the
pairs of PAIRS with their CONTROLS around an application that answers at once,
``--requests`` requests per chain and round, ``--rounds`` rounds in rotated order. A wrk
run cannot resolve this: tens of microseconds against a page of one millisecond or more are
below the ±25 % the machines here move by.

Figures (the report's tables): µs per request of each chain, median over the rounds
(min-max); the cost of each filter, control and pair (the chain minus the bare application,
per round), what each pair costs beyond its two parts (``A+B - A - B``: the pair's cost
minus both parts' costs, per round) and the kit's pipeline over the stock one (kit minus
stock, per round), median (min-max).

Output: the tables on stdout and ``<out>/filters-<YYYYmmdd-HHMMSS>/`` with ``report.json``
(the per-round seconds as measured) and ``report.md``. Exit status 0; 2 when the client is
not built or the run fails (the interpreter's message is printed).
"""
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

import psutil

from loadtests.core.cli import add_stack_arguments, new_parser
from loadtests.core.procs import free_local_port
from loadtests.core.reports import finish_report, markdown_table, report_folder
from loadtests.core.stack import ROOT
from loadtests.core.stats import format_spread, spread

INNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "filtercost_inner.py")
FILTERS = ("blobsendfile", "metrics", "translogger", "httpexceptions")
#: Single chains that are no filter of a pipeline, timed as controls for PAIRS: a filter that only
#: calls the application, and translogger with its logger disabled.
CONTROLS = ("noop", "translogger(log off)")
#: Chains of two filters, outer first: {name: (outer, inner)}. Each one's cost is reported, and
#: its cost beyond its parts': metrics around translogger costs more than both alone
#: (docs/results.md, 28 Nov 2026); the two controls say whether any frame around translogger
#: does that too, and whether it goes with the access log off.
PAIRS = {
    "metrics+translogger": ("metrics", "translogger"),
    "noop+translogger": ("noop", "translogger"),
    "metrics+translogger(log off)": ("metrics", "translogger(log off)"),
}
PIPELINES = ("stock", "kit")


def parse_args(argv):
    parser = new_parser("filters", "Microseconds per request that each WSGI filter of the kit's pipeline adds, "
                        "against Zope's stock pipeline, in the ZEO client's own interpreter.")
    parser.add_argument("--client", default="instance",
                        help="the ZEO client part whose interpreter and eggs are used (default instance)")
    parser.add_argument("--requests", type=int, default=20000, help="requests per chain and round (default 20000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each chain once per round (default 5)")
    add_stack_arguments(parser, stack_config=False)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.rounds < 1:
        parser.error("--requests and --rounds must be >= 1")
    return args


def summarize(seconds):
    """``(chains, costs)`` from ``{chain: [seconds per request, one per round]}``:
    ``chains`` ``{chain: spread of µs}``; ``costs`` ``{name: spread of µs}`` for each filter,
    CONTROLS and PAIRS chain (minus ``app`` in the same round), ``A+B - A - B`` for each pair
    (its cost minus both parts' costs in the same round: 0 when the pair costs its parts' sum)
    and ``kit - stock``; a figure whose chains were not all measured is left out."""
    micro = {name: [value * 1e6 for value in values] for name, values in seconds.items()}
    chains = {name: spread(values) for name, values in micro.items()}

    def difference(first, second):
        return spread([a - b for a, b in zip(micro[first], micro[second])])

    costs = {name: difference(name, "app") for name in FILTERS + CONTROLS + tuple(PAIRS) if name in micro}
    for pair, (outer, inner) in PAIRS.items():
        if all(name in micro for name in (pair, outer, inner, "app")):
            # (pair - app) - (outer - app) - (inner - app), per round as every cost here
            costs[f"{pair} - {outer} - {inner}"] = spread(
                [p - o - i + a for p, o, i, a in zip(micro[pair], micro[outer], micro[inner], micro["app"])])
    if all(name in micro for name in PIPELINES):
        costs["kit - stock"] = difference("kit", "stock")
    return chains, costs


def to_markdown(meta, chains, costs):
    """report.md: the settings, µs per chain, µs per filter and the kit's pipeline over the stock one."""
    return "\n".join([
        f"# WSGI filter costs, {meta['started']}",
        "",
        f"`{meta['command']}`: client `{meta['client']}` (Python {meta['python']}), {meta['requests']:,} "
        f"requests per chain and round, {meta['rounds']} rounds in rotated order; machine {meta['cores']} cores, "
        f"load average {meta['load_before']} before and {meta['load_after']} after. The application answers "
        "at once: the time is the filters' own.",
        "",
        "µs per request, median over the rounds (min–max):",
        "",
        markdown_table(["chain", "µs per request"],
                       [[name, format_spread(value, 1)] for name, value in chains.items()]),
        "",
        "µs each filter adds (its chain minus the application alone, per round), each pair's cost beyond "
        "its two parts (`A+B - A - B`, per round: 0 when a pair costs the sum of its parts), and what the kit's "
        "pipeline adds over Zope's stock one (kit minus stock, per round), median (min–max):",
        "",
        markdown_table(["filter", "µs per request"],
                       [[name, format_spread(value, 1)] for name, value in costs.items()]),
        "",
    ])


def main(argv=None):
    args = parse_args(argv)
    interpreter = os.path.join(ROOT, "parts", args.client, "bin", "interpreter")
    if not os.access(interpreter, os.X_OK):
        print(f"filters: {interpreter} does not exist: build the client first (make build)", file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc)
    load_before = [round(x, 2) for x in os.getloadavg()]
    result = subprocess.run([interpreter, INNER, str(args.requests), str(args.rounds), str(free_local_port())],
                            capture_output=True, text=True, timeout=3600, check=False)
    if result.returncode != 0:
        print(f"filters: {interpreter} {INNER} exited {result.returncode}:\n{result.stderr[-3000:]}", file=sys.stderr)
        return 2
    data = json.loads(result.stdout)
    chains, costs = summarize(data["seconds"])
    meta = {"started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["python -m loadtests filters", *(argv if argv is not None else sys.argv[1:])]),
            "client": args.client, "python": data["python"], "requests": data["requests"], "rounds": data["rounds"],
            "cores": psutil.cpu_count(), "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()]}
    return finish_report(report_folder(args.out, "filters"),
                         {"meta": meta, "chains": chains, "costs": costs, "seconds": data["seconds"]},
                         to_markdown(meta, chains, costs))


if __name__ == "__main__":
    sys.exit(main())
