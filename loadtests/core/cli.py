"""The command line every subcommand shares: its parser (``new_parser``), the options every
run has (``add_stack_arguments``, ``add_run_arguments``, ``add_counts_argument``,
``add_buildout_config_argument``, ``parse_counts``) and ``exits_2_when_not_ready``, which turns
a missing stack or wrk (``loadtests.core.stack.NotReady``) into one line and exit status 2.
"""
import argparse
import functools
import os
import sys

from loadtests.core.stack import NotReady, ROOT, STACK_JSON


# ----------------------------------------------------------------------------- arguments

def new_parser(subcommand, description, **kwargs):
    """The ``argparse.ArgumentParser`` of a subcommand: ``prog`` is how it is called,
    ``python -m loadtests <subcommand>`` (its usage and errors say so), ``description`` the
    one line under it; ``kwargs`` go to ArgumentParser (``epilog``, ...)."""
    return argparse.ArgumentParser(prog=f"python -m loadtests {subcommand}", description=description, **kwargs)


def add_stack_arguments(parser, stack_config=True):
    """Add the options every tool shares to an ``argparse`` parser: ``--stack-config`` (the
    stack's contract, default parts/stack/stack.json; left out with ``stack_config=False``,
    for tools that build stacks of their own) and ``--out`` (default var/reports)."""
    if stack_config:
        parser.add_argument("--stack-config", default=STACK_JSON,
                            help="stack.json written by bin/buildout (default parts/stack/stack.json)")
    parser.add_argument("--out", default=os.path.join(ROOT, "var", "reports"),
                        help="folder for the report folder (default var/reports)")


def add_run_arguments(parser, *, duration, warmup=None, rounds=None, duration_help="", warmup_help="",
                      rounds_help=""):
    """Add ``--duration`` (measured seconds per run) and, where a default is given,
    ``--warmup`` (uncounted seconds of load before each run) and ``--rounds`` (repetitions
    of the whole set, int), with the subcommand's defaults in the help; ``duration_help``,
    ``warmup_help`` and ``rounds_help`` replace the generic help text (the default is appended). Each seconds
    option parses as the type of its default (int for tools that hand it to wrk or Locust as
    whole seconds). Checks no bounds: the caller knows its own."""
    parser.add_argument("--duration", type=type(duration), default=duration,
                        help=(duration_help or "measured seconds per run") + f" (default {duration:g})")
    if warmup is not None:
        parser.add_argument("--warmup", type=type(warmup), default=warmup, help=(
            warmup_help or "seconds of uncounted load before each run (caches, ZODB connections, "
            "HAProxy's first picks)") + f" (default {warmup:g})")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help=(
            rounds_help or "repetitions of the whole set, alternating the order, so every "
            "comparison is of runs minutes apart under the same foreign load") + f" (default {rounds})")


def add_counts_argument(parser, option, default, help):
    """Add ``option`` (such as ``--connections``): a comma-separated list of integers >= 1,
    turned into a list by :func:`parse_counts` while argparse reads the command line, so
    ``args`` holds ``[int]`` (the default too, given as text such as ``"10,100"``; None stays
    None for a default the caller fills in). ``help`` gets ``(default ...)`` appended unless
    the default is None. A bad value exits 2 naming the option."""
    parser.add_argument(option, type=lambda text: parse_counts(parser, option, text), default=default,
                        help=help if default is None else f"{help} (default {default})")


def add_buildout_config_argument(parser, extended_by):
    """Add ``--buildout-config``: the config the stack was built with, which the tool's extra
    buildout (``extended_by``, text for the help) extends. Its default is None: the caller
    takes :func:`default_buildout_config` then (what ``make build`` recorded, else local.cfg
    or buildout.cfg), read when the tool runs rather than when --help is shown."""
    parser.add_argument("--buildout-config", default=None,
                        help=f"the config the stack was built with, extended by {extended_by}; default: what "
                        "make build recorded (var/buildout-config), else local.cfg if it exists, else buildout.cfg")


def name_list(parser, option, allowed):
    """argparse ``type`` of a comma-separated list of names from ``allowed``: anything else
    (or nothing) ends in ``parser.error`` naming ``option``, the names refused and those
    allowed (exit status 2). Lists of integers: :func:`parse_counts`."""
    def parse(text):
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            parser.error(f"{option}: {', '.join(bad) or 'empty'} not allowed; allowed: {', '.join(allowed)}")
        return values
    return parse


def parse_counts(parser, option, text, minimum=1):
    """``"10,100"`` -> ``[10, 100]``: a comma-separated list of integers >= ``minimum`` given
    to ``option`` (such as ``--connections``); anything else ends in ``parser.error`` naming
    the option, what was given and what is allowed (exit status 2)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = None
    if not counts or min(counts) < minimum:
        parser.error(f"{option}: expected comma-separated integers >= {minimum}, got {text!r}")
    return counts


def exits_2_when_not_ready(prog):
    """Decorator for a tool's ``main(argv)``: a NotReady it raises is printed as
    ``<prog>: <message>`` on stderr and main returns 2 (nothing was run). Keyword
    arguments pass through (the subcommand name an alias gives)."""
    def decorate(main):
        @functools.wraps(main)
        def run(argv=None, **kwargs):
            try:
                return main(argv, **kwargs)
            except NotReady as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 2
        return run
    return decorate
