"""One entry point for the load tools: ``python -m loadtests <subcommand> [options]``.

Each subcommand is one module's ``main(argv)``; ``python -m loadtests <subcommand> --help``
shows that module's own options. ``blob``, ``scaling`` and ``servers-wrk`` are presets of
``matrix`` (other defaults, same options). The old module commands (``python -m
loadtests.abtest``, ...) still work as aliases for one release; loadtests.blobbench,
loadtests.scaling and loadtests.servers_wrk are gone (docs/reference/loadtests.md).
"""
import argparse
import collections
import importlib
import sys

Subcommand = collections.namedtuple("Subcommand", "module summary preset", defaults=(None,))

#: subcommand -> its module (whose ``main(argv)`` runs it), one line for --help, and for the
#: matrix's presets the preset's name (``main(argv, preset=...)``; loadtests.matrix.matrix.PRESETS)
SUBCOMMANDS = {
    "ab": Subcommand("loadtests.ab.abtest", "A/B of the two servers through HAProxy (Locust)"),
    "connections": Subcommand("loadtests.connections.connections",
                              "N connections per path through HAProxy (wrk; --fairness: closed loop)"),
    "fairness": Subcommand("loadtests.fairness", "alias of 'connections --fairness' (goes next release)"),
    "blob": Subcommand("loadtests.matrix.matrix",
                       "matrix preset: the blob, blob-sendfile on/off, direct and via HAProxy", "blob"),
    "matrix": Subcommand("loadtests.matrix.matrix", "WSGI servers x threads x paths x connections (wrk)"),
    "scaling": Subcommand("loadtests.matrix.matrix", "matrix preset: req/s by number of ZEO clients behind HAProxy",
                          "scaling"),
    "cache": Subcommand("loadtests.cache.cachebench", "cache tier on vs off through the HTTPS edge (wrk)"),
    "attacks": Subcommand("loadtests.edge.attacks", "slow bodies, big POSTs, rate limits, uploads"),
    "servers-wrk": Subcommand("loadtests.matrix.matrix", "matrix preset: every WSGI server on / at 10 connections",
                              "servers-wrk"),
    "headline": Subcommand("loadtests.headline.headline", "the docs' headline figures in one run, with spread (wrk)"),
    "filters": Subcommand("loadtests.headline.filtercost",
                          "µs per request of each WSGI filter, kit vs stock pipeline"),
    "storage": Subcommand("loadtests.storage.storagebench", "ZEO vs RelStorage on PostgreSQL, stacks of its own (wrk)"),
    "conflicts": Subcommand("loadtests.storage.conflicts", "ConflictErrors per class and oid from the clients' logs"),
    "canary-judge": Subcommand("loadtests.ab.canary_judge",
                               "promote or roll back a canary by HAProxy's log (A/B statistics)"),
    "canary-deploy": Subcommand("loadtests.ab.canary_deploy",
                                "a canary deploy of another build on the running stack, under load, judged"),
    "canary-bench": Subcommand("loadtests.ab.canary_bench",
                               "the canary's sensitivity: smallest added delay rolled back, false rollbacks"),
    "soak": Subcommand("loadtests.soak.soak", "ZEO clients' RSS over a long run at a fixed request rate"),
}


def parser():
    """The top-level parser: one subparser per subcommand, whose options the module parses."""
    # The list is the epilog, one line each: argparse wraps subcommand names longer than
    # its help column onto two lines.
    listing = "\n".join(f"  {name:<13} {sub.summary}" for name, sub in SUBCOMMANDS.items())
    top = argparse.ArgumentParser(
        prog="python -m loadtests",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="plonedeploy's load tools, one subcommand each.",
        epilog=f"subcommands:\n{listing}\n\n'python -m loadtests <subcommand> --help' shows its options.")
    subs = top.add_subparsers(dest="subcommand", metavar="<subcommand>", required=True,
                              help="one of the subcommands below, then its options")
    for name in SUBCOMMANDS:
        # add_help=False: --help after the subcommand goes to the module's own parser.
        subs.add_parser(name, add_help=False)
    return top


def main(argv=None):
    """Run the subcommand named first in ``argv``; returns its exit status. An unknown or
    missing subcommand exits 2 (argparse)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Only the subcommand's name is ours; the rest goes to the module untouched.
    chosen = parser().parse_args(argv[:1] if argv and not argv[0].startswith("-") else argv)
    sub = SUBCOMMANDS[chosen.subcommand]
    module = importlib.import_module(sub.module)
    return module.main(argv[1:], preset=sub.preset) if sub.preset else module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
